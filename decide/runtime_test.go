package decide

import (
	"context"
	"errors"
	"strings"
	"testing"

	"wb/policies"
	"wb/session"
)

var egress = RuntimeInput{
	Session: Session{ID: "sess_1", Project: "proj_a", PolicyID: "pol_net@2", EndUserID: "u1", Tier: 2},
	Event:   Event{Type: EventEgress, Host: "pypi.org", Port: 443, Addresses: []string{"151.101.0.223"}},
}

// Runtime fails closed: the platform's kill stands and the plugins are not asked; a project
// policy that cannot answer, or plugins that cannot run, refuse the event; the platform's
// rules failing is an error. A plugin's deny kills, naming the plugin.
func TestRuntime(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	allowEgress := policies.RuntimeDecision{AllowEgress: true, Decider: "policy wb.runtime", Warnings: []string{"rego warns"}}
	for _, c := range []struct {
		name         string
		pol          *fakePolicies
		plug         *fakePlugins
		want         RuntimeVerdict
		err          bool
		pluginsAsked bool
	}{
		{name: "platform kill stands", pol: &fakePolicies{runtime: policies.RuntimeDecision{Kill: true, Rule: "metadata_egress", Decider: "policy wb.runtime"}},
			plug: &fakePlugins{decisions: []session.Decision{{Allow: true}}},
			want: RuntimeVerdict{Kill: true, Rule: "metadata_egress", Decider: "policy wb.runtime"}},
		{name: "project policy cannot answer", pol: &fakePolicies{runtime: policies.RuntimeDecision{Deny: true, DenyReason: "pol_net@2: timed out", AllowEgress: false}},
			plug: &fakePlugins{},
			want: RuntimeVerdict{Refuse: true, Reason: "pol_net@2: timed out"}},
		{name: "platform rules fail", pol: &fakePolicies{err: boom}, plug: &fakePlugins{}, err: true},
		{name: "plugin host fails", pol: &fakePolicies{runtime: allowEgress}, plug: &fakePlugins{err: boom}, pluginsAsked: true,
			want: RuntimeVerdict{Refuse: true, Reason: "runtime plugins: boom", Warnings: []string{"rego warns"}, Decider: "policy wb.runtime"}},
		{name: "plugin denies", pol: &fakePolicies{runtime: allowEgress}, pluginsAsked: true,
			plug: &fakePlugins{decisions: []session.Decision{
				{Allow: true, Decider: "plugin ok", Warnings: []string{"wasm warns"}},
				{Allow: false, Decider: "plugin net", Reasons: []string{"no pypi"}},
				{Allow: false, Decider: "plugin late", Reasons: []string{"me too"}},
			}},
			want: RuntimeVerdict{Kill: true, Rule: "plugin net", Reason: "no pypi", Decider: "plugin net", Warnings: []string{"rego warns", "wasm warns"}}},
		{name: "all allow", pol: &fakePolicies{runtime: allowEgress}, pluginsAsked: true,
			plug: &fakePlugins{decisions: []session.Decision{{Allow: true, Decider: "plugin ok", Warnings: []string{"wasm warns"}}}},
			want: RuntimeVerdict{AllowEgress: true, Decider: "policy wb.runtime", Warnings: []string{"rego warns", "wasm warns"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := Decider{Policies: c.pol, Plugins: c.plug, Now: fixed}.Runtime(ctx, egress)
			if (err != nil) != c.err {
				t.Fatalf("err %v", err)
			}
			if mustJSON(t, v) != mustJSON(t, c.want) {
				t.Fatalf("%+v\nwant %+v", v, c.want)
			}
			if asked := c.plug.calls() > 0; asked != c.pluginsAsked {
				t.Fatalf("plugins asked: %v", asked)
			}
		})
	}
}

// The deciders get typed events as their documents say: Rego the event's fields plus
// "session", the plugins ABI.md's input with the injected clock.
func TestRuntimeInputs(t *testing.T) {
	pol, plug := &fakePolicies{}, &fakePlugins{}
	d := Decider{Policies: pol, Plugins: plug, Now: fixed}
	ctx := context.Background()
	if _, err := d.Runtime(ctx, egress); err != nil {
		t.Fatal(err)
	}
	exec := RuntimeInput{Session: Session{ID: "sess_2", Project: "proj_a", Tier: 1}, Event: Event{Type: EventExec, Argv: []string{"/bin/sh", "-c", "ls"}, PTY: true, Host: "ignored"}}
	if _, err := d.Runtime(ctx, exec); err != nil {
		t.Fatal(err)
	}
	sample := RuntimeInput{Session: Session{ID: "sess_3", Project: "proj_a", Tier: 1}, Event: Event{Type: EventResourceSample}}
	if _, err := d.Runtime(ctx, sample); err != nil {
		t.Fatal(err)
	}
	if pol.policyID != "" || len(pol.inputs) != 3 {
		t.Fatalf("policy %q, %d inputs", pol.policyID, len(pol.inputs))
	}
	for i, want := range []string{
		`{"addresses":["151.101.0.223"],"host":"pypi.org","port":443,"session":{"end_user_id":"u1","id":"sess_1","policy_id":"pol_net@2","tier":2},"type":"egress"}`,
		`{"argv":["/bin/sh","-c","ls"],"pty":true,"session":{"id":"sess_2","tier":1},"type":"exec"}`,
		`{"cpu_ms":0,"interval_ms":0,"memory_bytes":0,"session":{"id":"sess_3","tier":1},"type":"resource_sample"}`,
	} {
		if got := mustJSON(t, pol.inputs[i]); got != want {
			t.Errorf("rego input %d: %s\nwant %s", i, got, want)
		}
	}
	in := plug.inputs[0]
	ev, _ := in["event"].(map[string]any)
	sess, _ := in["session"].(map[string]any)
	if in["_point"] != session.PointRuntime || in["at_ms"] != float64(clock.UnixMilli()) || ev["at_ms"] != float64(clock.UnixMilli()) ||
		ev["type"] != "egress" || !strings.Contains(mustJSON(t, ev["data"]), `"host":"pypi.org"`) || sess["id"] != "sess_1" || sess["end_user_id"] != "u1" {
		t.Fatalf("plugin input %s", mustJSON(t, in))
	}
}
