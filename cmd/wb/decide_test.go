//go:build linux

package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/node"
	"wb/plugins"
	"wb/policies"
	"wb/quota"
	"wb/session"
)

// decisionPointsForTest answers a policy engine whose evaluations time out after 50 ms and a
// plugin host, both on a fresh Redis.
func decisionPointsForTest(t *testing.T, log *slog.Logger) (*policies.Engine, *plugins.Host) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	// 1 s: the slow policies below never finish in it (4e8 iterations), and a loaded cold
	// make test took more than the 50 ms it was to answer an open policy (denied: fails closed).
	pol, err := policies.New(ctx, rdb, policies.Options{Logger: log, EvalTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pol.Close(ctx) })
	host, err := plugins.NewHost(ctx, rdb, plugins.Options{CacheDir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Close(ctx) })
	return pol, host
}

// TestRuntimeCheckerFailsClosed: a pinned policy that runs out of time refuses the event
// (exec and egress alike) and never hides the platform's kill; a working one decides.
func TestRuntimeCheckerFailsClosed(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	pol, host := decisionPointsForTest(t, log)
	c := runtimeChecker{pol: pol, plug: host, log: log}

	slow, err := pol.Put(ctx, "proj_dc", "slow", `package wb.runtime

allow_egress if {
	some i in numbers.range(1, 20000)
	some j in numbers.range(1, 20000)
	i * j < 0
}
`, policies.ModeEnforce)
	if err != nil {
		t.Fatal(err)
	}
	open, err := pol.Put(ctx, "proj_dc", "open", "package wb.runtime\n\nallow_egress := true\n", policies.ModeEnforce)
	if err != nil {
		t.Fatal(err)
	}
	sess := func(policyID string) node.RuntimeSession {
		return node.RuntimeSession{ID: "sess_dc", Project: "proj_dc", PolicyID: policyID, Tier: 2}
	}
	metadata := session.GuestEvent{Type: session.GuestEgress, Host: "169.254.169.254", Port: 80}
	pypi := session.GuestEvent{Type: session.GuestEgress, Host: "pypi.org", Port: 443}
	miner := session.GuestEvent{Type: session.GuestExec, Argv: []string{"/usr/bin/xmrig"}}
	ls := session.GuestEvent{Type: session.GuestExec, Argv: []string{"ls"}}
	for _, tc := range []struct {
		name     string
		policyID string
		event    session.GuestEvent
		want     node.Verdict
	}{
		{"slow policy, metadata egress", slow.ID, metadata, node.Verdict{Kill: true, Rule: "metadata_egress"}},
		{"slow policy, miner", slow.ID, miner, node.Verdict{Kill: true, Rule: "crypto_miner"}},
		{"slow policy, egress", slow.ID, pypi, node.Verdict{Deny: true}},
		{"slow policy, exec", slow.ID, ls, node.Verdict{Deny: true}},
		{"missing policy, exec", "pol_gone@1", ls, node.Verdict{Deny: true}},
		{"open policy, egress", open.ID, pypi, node.Verdict{AllowEgress: true}},
		{"open policy, metadata egress", open.ID, metadata, node.Verdict{Kill: true, Rule: "metadata_egress"}},
		{"open policy, exec", open.ID, ls, node.Verdict{AllowEgress: true}},
	} {
		v, err := c.Check(ctx, sess(tc.policyID), tc.event)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if tc.want.Deny && (v.Reason == "" || !strings.Contains(v.Reason, tc.policyID)) {
			t.Errorf("%s: reason %q does not name %s", tc.name, v.Reason, tc.policyID)
		}
		v.Reason = ""
		if v != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, v, tc.want)
		}
	}
}

// TestSpendDeciderKeepsPlatformCap: a project's spend policy that runs out of time does not
// keep the platform's hard cap from stopping the end user's sessions; a soft cap stops nothing;
// a cap event the decision point cannot read is an error (quota then applies its default).
func TestSpendDeciderKeepsPlatformCap(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	pol, host := decisionPointsForTest(t, log)
	if _, err := pol.Put(ctx, "proj_sd", "slow", "package wb.spend\n\nstop_sessions := \"end_user\" if {\n\tsome i in numbers.range(1, 20000)\n\tsome j in numbers.range(1, 20000)\n\ti * j < 0\n}\n", policies.ModeEnforce); err != nil {
		t.Fatal(err)
	}
	spend := spendDecider(pol, host, log)
	ev := quota.CapEvent{Project: "proj_sd", EndUser: "u1", Scope: "end_user", Level: "hard", SpendMicroUSD: 5e6, CapMicroUSD: 5e6, Month: "2026-05"}
	d, err := spend(ctx, ev)
	if err != nil || !d.Stop || !d.DenyAdmission || !strings.Contains(strings.Join(d.Warnings, "|"), "pol_slow@1") {
		t.Fatalf("hard: %+v %v", d, err)
	}
	ev.Level, ev.SpendMicroUSD = "soft", 4e6
	if d, err := spend(ctx, ev); err != nil || d.Stop || d.DenyAdmission {
		t.Fatalf("soft: %+v %v", d, err)
	}
	ev.Scope = "tenant"
	if _, err := spend(ctx, ev); err == nil {
		t.Fatal("a bad scope was read")
	}
}
