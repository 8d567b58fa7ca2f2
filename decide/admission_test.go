package decide

import (
	"context"
	"errors"
	"strings"
	"testing"

	"wb/plugins"
	"wb/session"
)

// Any deny wins and the reasons of every decider are returned; warnings of all are kept.
func TestCombinePrecedence(t *testing.T) {
	d := Combine(
		session.Decision{Allow: false, Reasons: []string{"pol_a@1: no"}, Decider: "policy pol_a@1"},
		session.Decision{Allow: true, Warnings: []string{"careful"}, Decider: "plugin ok", Patch: map[string]any{"metadata": map[string]any{"a": "1"}}},
		session.Decision{Allow: false, Reasons: []string{"tier too high"}, Decider: "plugin cap", Patch: map[string]any{"metadata": map[string]any{"b": "2"}}},
		session.Decision{Allow: false, Decider: "plugin quiet"},
	)
	if d.Allow || len(d.Reasons) != 3 || d.Reasons[1] != "plugin cap: tier too high" || d.Reasons[2] != "denied by plugin quiet" || d.Warnings[0] != "careful" {
		t.Fatalf("%+v", d)
	}
	if m := d.Patch["metadata"].(map[string]any); m["a"] != "1" || m["b"] != "2" {
		t.Fatalf("patches did not merge: %v", d.Patch)
	}
	if all := Combine(session.Decision{Allow: true}, session.Decision{Allow: true}); !all.Allow || all.Patch != nil {
		t.Fatalf("two allows: %+v", all)
	}
}

// Combine keeps every decider's nulls, the first's included, so applying the combined patch
// removes the fields, as plugins/ABI.md promises. With apply semantics (the code before
// internal/mergepatch) the nulls of a patch vanish into {"metadata":{}} and nothing is removed.
func TestCombineKeepsNulls(t *testing.T) {
	d := Combine(
		session.Decision{Allow: true, Decider: "policy pol_scrub@1", Patch: map[string]any{"metadata": map[string]any{"secret": nil}}},
		session.Decision{Allow: true, Decider: "plugin a", Patch: map[string]any{"idle_timeout_s": 60.0, "metadata": map[string]any{"a": "1"}}},
		session.Decision{Allow: true, Decider: "plugin b", Patch: map[string]any{"idle_timeout_s": nil}},
	)
	if got := mustJSON(t, d.Patch); !d.Allow || got != `{"idle_timeout_s":null,"metadata":{"a":"1","secret":null}}` {
		t.Fatalf("allow %v, patch %s", d.Allow, got)
	}
	idle, tier := 300, 2
	req := session.CreateRequest{Tier: &tier, IdleTimeoutS: &idle, Metadata: map[string]string{"secret": "s", "keep": "k"}}
	got, err := plugins.ApplyPatch(req, d)
	if err != nil {
		t.Fatal(err)
	}
	if got.IdleTimeoutS != nil || got.Metadata["secret"] != "" || got.Metadata["a"] != "1" || got.Metadata["keep"] != "k" {
		t.Fatalf("combined patch %v gave idle %v metadata %v", d.Patch, got.IdleTimeoutS, got.Metadata)
	}
}

// The issue's patch, {"end_user_id":null,"metadata":{"secret":null}}: end_user_id (who pays)
// is not patchable, so the plugin's decision is a deny naming the field, and its patch is
// dropped whole; the same patch on metadata alone keeps its null.
func TestCombineIssuePatch(t *testing.T) {
	issue := map[string]any{"end_user_id": nil, "metadata": map[string]any{"secret": nil}}
	d := Combine(session.Decision{Allow: true, Decider: "plugin scrub", Patch: issue})
	if d.Allow || len(d.Reasons) != 1 || !strings.Contains(d.Reasons[0], `plugin scrub: a patch may not set "end_user_id"`) || d.Patch != nil {
		t.Fatalf("%+v", d)
	}
	d = Combine(session.Decision{Allow: true, Decider: "plugin scrub", Patch: map[string]any{"metadata": map[string]any{"secret": nil}}})
	if got := mustJSON(t, d.Patch); !d.Allow || got != `{"metadata":{"secret":null}}` {
		t.Fatalf("allow %v, patch %s", d.Allow, got)
	}
}

// A patch outside the patchable fields, or setting an object where an earlier decider set
// null, turns its decision into a deny; Admit answers it as a *PatchError naming the field.
func TestCombineConfinesPatches(t *testing.T) {
	for _, c := range []struct {
		name  string
		ds    []session.Decision
		field string
		says  string
	}{
		{"policy_id", []session.Decision{
			{Allow: true, Decider: "plugin ok", Patch: map[string]any{"tier": 1.0}},
			{Allow: true, Decider: "plugin bad", Patch: map[string]any{"policy_id": "pol_open@1"}},
		}, "policy_id", `plugin bad: a patch may not set "policy_id"`},
		{"reserved metadata", []session.Decision{
			{Allow: true, Decider: "policy pol_x@1", Patch: map[string]any{"metadata": map[string]any{"ok": "1", "wb.owner": "x"}}},
		}, "metadata.wb.owner", `policy pol_x@1: a patch may not set metadata key "wb.owner"`},
		{"object after null", []session.Decision{
			{Allow: true, Decider: "policy pol_x@1", Patch: map[string]any{"metadata": nil}},
			{Allow: true, Decider: "plugin tag", Patch: map[string]any{"metadata": map[string]any{"team": "core"}}},
		}, "metadata", `plugin tag: its patch sets "metadata" to an object after an earlier decider set it to null`},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Combine(c.ds...)
			if d.Allow || len(d.Reasons) != 1 || !strings.Contains(d.Reasons[0], c.says) {
				t.Fatalf("%+v", d)
			}
			for _, in := range c.ds[:len(c.ds)-1] { // the earlier patches still compose
				if mustJSON(t, d.Patch) != mustJSON(t, in.Patch) {
					t.Fatalf("patch %v, want %v", d.Patch, in.Patch)
				}
			}
			_, err := Decider{Plugins: &fakePlugins{decisions: c.ds}}.Admit(context.Background(), session.AdmissionInput{ProjectID: "proj_a"})
			var pe *PatchError
			if !errors.As(err, &pe) || pe.Field != c.field || !strings.Contains(pe.Error(), c.says) {
				t.Fatalf("Admit: %v (%#v)", err, pe)
			}
		})
	}
}

// Admission fails closed: the Rego engine or the plugin host failing refuses the create.
// Otherwise Rego runs first, then the plugins on an input stamped by the injected clock, and
// every warning is kept.
func TestAdmit(t *testing.T) {
	ctx := context.Background()
	tier := 2
	in := session.AdmissionInput{ProjectID: "proj_a", Request: session.CreateRequest{Tier: &tier}, Active: 3}
	boom := errors.New("boom")
	if _, err := (Decider{Policies: &fakePolicies{err: boom}, Plugins: &fakePlugins{}}).Admit(ctx, in); !errors.Is(err, boom) {
		t.Fatalf("policies failing: %v", err)
	}
	if _, err := (Decider{Policies: &fakePolicies{admit: session.Decision{Allow: true}}, Plugins: &fakePlugins{err: boom}}).Admit(ctx, in); !errors.Is(err, boom) {
		t.Fatalf("plugin host failing: %v", err)
	}
	pol := &fakePolicies{admit: session.Decision{Allow: true, Decider: "policy wb.admission", Warnings: []string{"from rego"}, Patch: map[string]any{"idle_timeout_s": 120.0}}}
	plug := &fakePlugins{decisions: []session.Decision{{Allow: true, Decider: "plugin p", Warnings: []string{"from wasm"}, Patch: map[string]any{"max_lifetime_s": nil}}}}
	d, err := Decider{Policies: pol, Plugins: plug, Now: fixed}.Admit(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allow || d.Decider != "policy wb.admission, plugin p" || strings.Join(d.Warnings, "|") != "from rego|from wasm" ||
		mustJSON(t, d.Patch) != `{"idle_timeout_s":120,"max_lifetime_s":null}` {
		t.Fatalf("%+v", d)
	}
	got := plug.inputs[0]
	if got["_point"] != session.PointAdmission || got["at_ms"] != float64(clock.UnixMilli()) || got["active_sessions"] != 3.0 || got["project_id"] != "proj_a" {
		t.Fatalf("plugin input %v", got)
	}
	// Neither evaluator: everything is allowed.
	if d, err := (Decider{}).Admit(ctx, in); err != nil || !d.Allow {
		t.Fatalf("zero Decider: %+v %v", d, err)
	}
}
