package decide

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/policies"
	"wb/session"
)

// Scopes are ordered by what they cover, not by their names.
func TestScopeOrder(t *testing.T) {
	if !(ScopeNone < ScopeEndUser && ScopeEndUser < ScopeProject) {
		t.Fatal("scopes out of order")
	}
	for _, s := range []Scope{ScopeNone, ScopeEndUser, ScopeProject} {
		if got, err := ParseScope(s.String()); err != nil || got != s {
			t.Fatalf("%v: %v %v", s, got, err)
		}
	}
	if _, err := ParseScope("tenant"); err == nil || !strings.Contains(err.Error(), "project or end_user") {
		t.Fatalf("bad scope: %v", err)
	}
	for _, l := range []Level{LevelSoft, LevelHard} {
		if got, err := ParseLevel(l.String()); err != nil || got != l {
			t.Fatalf("%v: %v %v", l, got, err)
		}
	}
	if _, err := ParseLevel("medium"); err == nil {
		t.Fatal("bad level accepted")
	}
}

// Spend starts from the platform's floor (a hard cap stops its scope and denies admissions);
// a tenant's deciders can widen it but nothing they do or fail to do lifts it.
func TestSpend(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	hardUser := SpendInput{Project: "proj_a", Scope: ScopeEndUser, EndUserID: "u1", Level: LevelHard, SpendMicroUSD: 5e6, CapMicroUSD: 5e6, Month: "2026-05"}
	soft := hardUser
	soft.Level = LevelSoft
	deny := []session.Decision{{Allow: false, Decider: "plugin budget", Reasons: []string{"over budget"}}}
	for _, c := range []struct {
		name     string
		in       SpendInput
		pol      *fakePolicies
		plug     *fakePlugins
		stop     Scope
		denyAdm  bool
		warnings string // substring of the joined warnings
	}{
		{"hard, policies fail", hardUser, &fakePolicies{err: boom}, &fakePlugins{}, ScopeEndUser, true, "spend policies failed, so only the platform's cap applies: boom"},
		{"hard, plugin host fails", hardUser, &fakePolicies{}, &fakePlugins{err: boom}, ScopeEndUser, true, "spend plugins failed"},
		{"hard, both fail", hardUser, &fakePolicies{err: boom}, &fakePlugins{err: boom}, ScopeEndUser, true, "spend plugins failed"},
		{"hard, tenant deciders say nothing", hardUser, &fakePolicies{}, &fakePlugins{decisions: []session.Decision{{Allow: true}}}, ScopeEndUser, true, ""},
		{"hard, fail-open plugin failed", hardUser, &fakePolicies{}, &fakePlugins{decisions: []session.Decision{{Allow: true, Warnings: []string{"plugin budget failed open: trapped"}}}}, ScopeEndUser, true, "failed open"},
		{"hard, nonsense scope from rego", hardUser, &fakePolicies{spend: policies.SpendDecision{StopScope: "galaxy", Decider: "policy pol_x@1"}}, &fakePlugins{}, ScopeEndUser, true, `spend scope "galaxy"`},
		{"hard, rego widens to project", hardUser, &fakePolicies{spend: policies.SpendDecision{StopScope: "project", DenyAdmission: true}}, &fakePlugins{}, ScopeProject, true, ""},
		{"soft, nothing", soft, &fakePolicies{spend: policies.SpendDecision{Warnings: []string{"at 80%"}}}, &fakePlugins{}, ScopeNone, false, "at 80%"},
		{"soft, policies fail", soft, &fakePolicies{err: boom}, &fakePlugins{}, ScopeNone, false, "boom"},
		{"soft, plugin denies", soft, &fakePolicies{}, &fakePlugins{decisions: deny}, ScopeEndUser, true, "over budget"},
		{"soft, rego stops early", soft, &fakePolicies{spend: policies.SpendDecision{StopScope: "end_user"}}, &fakePlugins{}, ScopeEndUser, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Decider{Policies: c.pol, Plugins: c.plug, Now: fixed, Logger: slog.New(slog.DiscardHandler)}.Spend(ctx, c.in)
			if d.Stop != c.stop || d.DenyAdmission != c.denyAdm || !strings.Contains(strings.Join(d.Warnings, "|"), c.warnings) {
				t.Fatalf("%+v", d)
			}
		})
	}
	// No evaluator at all: the floor alone.
	if d := (Decider{}).Spend(ctx, hardUser); d.Stop != ScopeEndUser || !d.DenyAdmission {
		t.Fatalf("zero Decider: %+v", d)
	}
}

// The inputs: Rego gets only the crossed figure and its cap; the plugins ABI.md's spend input
// with the injected clock and no session.
func TestSpendInputs(t *testing.T) {
	pol, plug := &fakePolicies{}, &fakePlugins{}
	in := SpendInput{Project: "proj_a", Scope: ScopeProject, Level: LevelSoft, SpendMicroUSD: 4e6, CapMicroUSD: 5e6, Month: "2026-05"}
	Decider{Policies: pol, Plugins: plug, Now: fixed}.Spend(context.Background(), in)
	if got := mustJSON(t, pol.inputs[0]); got != `{"caps":{"monthly_spend_cap_micro_usd":5000000},"end_user_id":"","plan":{},"project_spend_micro_usd":4000000}` {
		t.Fatalf("rego input %s", got)
	}
	got := plug.inputs[0]
	if got["_point"] != session.PointSpend || got["at_ms"] != float64(clock.UnixMilli()) || got["session"] != nil ||
		mustJSON(t, got["spend"]) != `{"cap_micro_usd":5000000,"level":"soft","month":"2026-05","scope":"project","spend_micro_usd":4000000}` {
		t.Fatalf("plugin input %s", mustJSON(t, got))
	}
}

// With the real Rego engine: the project's spend policy runs out of time and its plugin host
// fails, and the platform's own cap still stops the end user's sessions and their admissions.
func TestSpendPlatformCapSurvivesBrokenTenant(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	pol, err := policies.New(ctx, redistest.Server(t), policies.Options{Logger: log, EvalTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pol.Close(ctx) })
	// Lifts nothing it could not (stop scopes only widen), and fails before it answers anyway.
	if _, err := pol.Put(ctx, "proj_sp", "slow", `package wb.spend

deny_admission := false

stop_sessions := "end_user" if {
	some i in numbers.range(1, 20000)
	some j in numbers.range(1, 20000)
	i * j < 0
}
`, policies.ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d := Decider{Policies: pol, Plugins: &fakePlugins{err: errors.New("redis: connection refused")}, Now: fixed, Logger: log}
	in := SpendInput{Project: "proj_sp", Scope: ScopeEndUser, EndUserID: "u1", Level: LevelHard, SpendMicroUSD: 5e6, CapMicroUSD: 5e6, Month: "2026-05"}
	got := d.Spend(ctx, in)
	warn := strings.Join(got.Warnings, "|")
	if got.Stop != ScopeEndUser || !got.DenyAdmission || !strings.Contains(warn, "pol_slow@1") || !strings.Contains(warn, "spend plugins failed") {
		t.Fatalf("%+v", got)
	}
}
