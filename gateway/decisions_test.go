package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/internal/wasmtest"
	"wb/plugins"
	"wb/policies"
	"wb/session"
	"wb/store"
)

const tier4Policy = `package wb.admission

deny contains "tier 4 needs a plan" if {
	input.request.tier == 4
	not input.request.metadata.plan
}
`

// withDecisionPoints gives the gateway policies and plugins kept in rdb, its store's Redis.
func withDecisionPoints(t *testing.T, rdb redis.UniversalClient) envOpt {
	return func(c *Config) {
		ctx := context.Background()
		pol, err := policies.New(ctx, rdb, policies.Options{})
		if err != nil {
			t.Fatal(err)
		}
		host, err := plugins.NewHost(ctx, rdb, plugins.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pol.Close(ctx); _ = host.Close(ctx) })
		c.Policies, c.Plugins = pol, host
	}
}

func (e *env) putPolicy(key, name, mode, src string) response {
	e.t.Helper()
	return e.do("PUT", "/v1/policies/"+name+"?mode="+mode, key, []byte(src), "Content-Type", "text/plain")
}

// A policy that denies tier 4 to end users without a plan, in each mode.
func TestPolicyModes(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, withDecisionPoints(t, rdb))
	for _, mode := range []string{"enforce", "warn", "dryrun"} {
		t.Run(mode, func(t *testing.T) {
			projID, key := e.newProject("modes-"+mode, nil)
			r := e.putPolicy(key, "tier4", mode, tier4Policy)
			if r.status != 201 || !strings.Contains(string(r.body), `"id":"pol_tier4@1"`) || !strings.Contains(string(r.body), `"mode":"`+mode+`"`) {
				t.Fatalf("PUT: %d %s", r.status, r.body)
			}
			r = e.do("POST", "/v1/sessions", key, map[string]any{"tier": 4, "region": "far"})
			switch mode {
			case "enforce":
				if msg := expectError(t, r, 403, "denied", ""); !strings.Contains(msg, "tier 4 needs a plan") {
					t.Fatalf("403 without the policy's message: %s", msg)
				}
			case "warn":
				if r.status != 201 || !strings.Contains(r.header.Get("Warning"), "tier 4 needs a plan") {
					t.Fatalf("warn: %d, Warning %q", r.status, r.header.Get("Warning"))
				}
			case "dryrun":
				if r.status != 201 || r.header.Get("Warning") != "" {
					t.Fatalf("dryrun: %d, Warning %q", r.status, r.header.Get("Warning"))
				}
				// The decision log (a Redis stream, written asynchronously) says would-deny.
				deadline := time.Now().Add(30 * time.Second)
				for {
					entries, _ := e.rdb.XRange(context.Background(), policies.DecisionsKey(projID), "-", "+").Result()
					found := false
					for _, en := range entries {
						for _, v := range en.Values {
							if s, ok := v.(string); ok && strings.Contains(s, "would deny") {
								found = true
							}
						}
					}
					if found {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("no would-deny in the decision log: %v", entries)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			// With a plan the policy allows, in every mode.
			e.mustDo("POST", "/v1/sessions", key, map[string]any{"tier": 4, "region": "far", "metadata": map[string]string{"plan": "pro"}}, 201, nil)
		})
	}
}

func TestPolicyUploadsAndPinning(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, withDecisionPoints(t, rdb))
	cases := []struct {
		name, src string
		line      string
	}{
		{"syntax", "package wb.admission\n\ndeny contains \"x\" if {\n\tinput.request.tier ==\n}\n", "line 5"},
		{"unsafe", "package wb.admission\n\ndeny contains msg if {\n\tinput.request.tier == 4\n\tx == 1\n\tmsg := \"no\"\n}\n", "line "},
		{"nopackage", "deny contains \"x\" if { true }\n", "line 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.putPolicy(e.key, "bad_"+c.name, "enforce", c.src)
			msg := expectError(t, r, 400, "policy_compile_error", "*")
			if !strings.Contains(msg, c.line) || !strings.Contains(msg, "column") {
				t.Fatalf("no position in %q", msg)
			}
		})
	}
	expectError(t, e.putPolicy(e.key, "x", "loud", tier4Policy), 400, "invalid_request", "mode")
	expectError(t, e.putPolicy(e.key, "Bad-Name", "enforce", tier4Policy), 400, "invalid_request", "*")
	// Versions, and a session pins the exact version it was created with.
	e.putPolicy(e.key, "build_tools", "enforce", tier4Policy)
	r := e.putPolicy(e.key, "build_tools", "warn", tier4Policy)
	if !strings.Contains(string(r.body), `"id":"pol_build_tools@2"`) {
		t.Fatalf("second version: %s", r.body)
	}
	var list struct {
		Data []struct {
			ID   string `json:"id"`
			Mode string `json:"mode"`
		} `json:"data"`
	}
	e.mustDo("GET", "/v1/policies/build_tools", e.key, nil, 200, &list)
	if len(list.Data) != 2 || list.Data[0].ID != "pol_build_tools@2" || list.Data[1].Mode != "enforce" {
		t.Fatalf("versions %+v", list.Data)
	}
	e.mustDo("GET", "/v1/policies", e.key, nil, 200, &list)
	expectError(t, e.do("GET", "/v1/policies/nope", e.key, nil), 404, "not_found", "")
	var s session.Session
	e.mustDo("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "region": "far", "policy_id": "pol_build_tools"}, 201, &s)
	if *s.PolicyID != "pol_build_tools@2" {
		t.Fatalf("pinned %q", *s.PolicyID)
	}
	e.mustDo("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "region": "far", "policy_id": "pol_build_tools@1"}, 201, &s)
	if *s.PolicyID != "pol_build_tools@1" {
		t.Fatalf("pinned %q", *s.PolicyID)
	}
	expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "policy_id": "pol_build_tools@9"}), 400, "invalid_request", "policy_id")
	_, keyB := e.newProject("B", nil)
	expectError(t, e.do("POST", "/v1/sessions", keyB, map[string]any{"tier": 2, "policy_id": "pol_build_tools"}), 400, "invalid_request", "policy_id")
}

// TestPolicyDelete: DELETE /v1/policies/{name} answers 409 naming the live sessions that pin
// one of its versions, and once none does deletes them all: the policy no longer applies and
// is gone from the listings; a second delete, or another project's, is a 404.
func TestPolicyDelete(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, withDecisionPoints(t, rdb))
	projID, key := e.newProject("delete-policy", nil)
	e.putPolicy(key, "tier4", "enforce", tier4Policy)
	e.putPolicy(key, "tier4", "enforce", tier4Policy)
	expectError(t, e.do("POST", "/v1/sessions", key, map[string]any{"tier": 4, "region": "far"}), 403, "denied", "")
	var s session.Session
	e.mustDo("POST", "/v1/sessions", key, map[string]any{"tier": 2, "region": "far", "policy_id": "pol_tier4@1"}, 201, &s)

	msg := expectError(t, e.do("DELETE", "/v1/policies/tier4", key, nil), 409, "invalid_state", "")
	if !strings.Contains(msg, "1 live session") || !strings.Contains(msg, s.ID) {
		t.Fatalf("409 without the pinning session: %s", msg)
	}
	_, keyB := e.newProject("delete-policy-b", nil)
	expectError(t, e.do("DELETE", "/v1/policies/tier4", keyB, nil), 404, "not_found", "")

	if r := e.do("DELETE", "/v1/sessions/"+s.ID, key, nil); r.status != 200 && r.status != 202 {
		t.Fatalf("DELETE the session: %d %s", r.status, r.body)
	}
	e.waitState(key, s.ID, session.Stopped)
	msg = expectError(t, e.do("DELETE", "/v1/policies/tier4", key, nil), 409, "invalid_state", "")
	if !strings.Contains(msg, "named by a session created within") {
		t.Fatalf("409 for a version named moments ago: %s", msg)
	}
	rdb.Del(context.Background(), store.ProjectKeys(projID).Policies().Named()) // the pin window passes

	var del PolicyDeleted
	e.mustDo("DELETE", "/v1/policies/tier4", key, nil, 200, &del)
	if del != (PolicyDeleted{Object: "policy", Name: "tier4", Deleted: true, Versions: 2}) {
		t.Fatalf("delete answered %+v", del)
	}
	expectError(t, e.do("GET", "/v1/policies/tier4", key, nil), 404, "not_found", "")
	var list session.List[Policy]
	e.mustDo("GET", "/v1/policies", key, nil, 200, &list)
	if len(list.Data) != 0 {
		t.Fatalf("policies after the delete: %+v", list.Data)
	}
	e.mustDo("POST", "/v1/sessions", key, map[string]any{"tier": 4, "region": "far"}, 201, nil)
	expectError(t, e.do("DELETE", "/v1/policies/tier4", key, nil), 404, "not_found", "")
	expectError(t, e.do("DELETE", "/v1/policies/Bad-Name", key, nil), 400, "invalid_request", "name")
}

// A tenant's admission policy patches the request through defaults. Patches may touch only
// PatchableFields, never a reserved metadata key, and the patched request is validated again:
// anything else is a 403 naming the field and the policy.
func TestAdmissionPatchIsConfined(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, withDecisionPoints(t, rdb))
	_, keyB := e.newProject("victim", nil)
	e.putPolicy(keyB, "open", "enforce", "package wb.runtime\n\nallow_egress := true\n")
	cases := []struct {
		name, defaults, param string
	}{
		{"restore_from", `{"restore_from": "snap_0000000000000000000000000"}`, "restore_from"},
		{"policy_id", `{"policy_id": "pol_open@1"}`, "policy_id"},
		{"region", `{"region": "far"}`, "region"},
		{"template", `{"template": "tpl_dev_polyglot"}`, "template"},
		{"end_user_id", `{"end_user_id": "someone_else"}`, "end_user_id"},
		{"reserved_metadata", `{"metadata": {"wb.owner": "platform"}}`, "metadata.wb.owner"},
		{"idle_out_of_range", `{"idle_timeout_s": 999999999}`, "idle_timeout_s"},
		{"tier_out_of_range", `{"tier": 9}`, "tier"},
		{"resources_over_tier", `{"resources": {"vcpu": 64}}`, "*"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, key := e.newProject("patch-"+c.name, nil)
			if r := e.putPolicy(key, "inject", "enforce", "package wb.admission\n\ndefaults := "+c.defaults+"\n"); r.status != 201 {
				t.Fatalf("PUT policy: %d %s", r.status, r.body)
			}
			msg := expectError(t, e.do("POST", "/v1/sessions", key, map[string]any{"tier": 2}), 403, "denied", c.param)
			if !strings.Contains(msg, "pol_inject@1") {
				t.Fatalf("the reason does not name the policy: %s", msg)
			}
		})
	}
	// What a policy may do: set limits and labels, validated.
	_, key := e.newProject("patch-ok", nil)
	e.putPolicy(key, "labels", "enforce", "package wb.admission\n\ndefaults := {\"idle_timeout_s\": 120, \"metadata\": {\"team\": \"core\"}}\n")
	var s session.Session
	e.mustDo("POST", "/v1/sessions", key, map[string]any{"tier": 2, "metadata": map[string]string{"x": "1"}}, 201, &s)
	if s.IdleTimeoutS != 120 || s.Metadata["team"] != "core" || s.Metadata["x"] != "1" {
		t.Fatalf("patch not applied: idle %d metadata %v", s.IdleTimeoutS, s.Metadata)
	}
}

type patchingAdmitter struct{ patch map[string]any }

func (a patchingAdmitter) Admit(context.Context, session.AdmissionInput) (session.Decision, error) {
	return session.Decision{Allow: true, Decider: "plugin sneaky", Patch: a.patch}, nil
}

// An Admitter other than Chain gets the same confinement: the gateway checks the final patch.
func TestAdmissionPatchFromAnyAdmitter(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Admitter = patchingAdmitter{map[string]any{"restore_from": "snap_x"}}
	})
	msg := expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2}), 403, "denied", "restore_from")
	if !strings.Contains(msg, "plugin sneaky") {
		t.Fatal(msg)
	}
	// The caller itself cannot set a reserved key either.
	expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "metadata": map[string]string{"wb.owner": "x"}}), 400, "invalid_request", "metadata.wb.owner")
}

// A Rego policy and a plugin both remove fields of the create request with nulls (RFC 7386):
// the session is created without them. The chain composes the deciders' patches keeping the
// nulls; merged with apply semantics they would vanish and nothing would be removed.
func TestAdmissionPatchesRemoveFields(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, withDecisionPoints(t, rdb))
	_, key := e.newProject("scrub", nil)
	if r := e.putPolicy(key, "scrub", "enforce", "package wb.admission\n\ndefaults := {\"idle_timeout_s\": null, \"metadata\": {\"secret\": null}}\n"); r.status != 201 {
		t.Fatalf("PUT policy: %d %s", r.status, r.body)
	}
	strip := wasmtest.ConstPlugin(`{"allow":true,"warnings":["stripped"],"patch":{"max_lifetime_s":null,"metadata":{"token":null,"team":"core"}}}`)
	if r := e.do("PUT", "/v1/plugins/strip?points=admission", key, strip, "Content-Type", "application/wasm"); r.status != 201 {
		t.Fatalf("PUT plugin: %d %s", r.status, r.body)
	}
	var plain, s session.Session
	e.mustDo("POST", "/v1/sessions", e.key, map[string]any{"tier": 2}, 201, &plain) // the tier's defaults
	r := e.do("POST", "/v1/sessions", key, map[string]any{"tier": 2, "idle_timeout_s": 600, "max_lifetime_s": 7200,
		"metadata": map[string]string{"secret": "s", "token": "t", "keep": "k"}})
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if err := json.Unmarshal(r.body, &s); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"keep": "k", "team": "core"}; !maps.Equal(s.Metadata, want) {
		t.Errorf("metadata %v, want %v", s.Metadata, want)
	}
	if s.IdleTimeoutS != plain.IdleTimeoutS || s.MaxLifetimeS != plain.MaxLifetimeS {
		t.Errorf("idle %d, lifetime %d: want the tier's defaults %d, %d (the nulls removed the caller's)",
			s.IdleTimeoutS, s.MaxLifetimeS, plain.IdleTimeoutS, plain.MaxLifetimeS)
	}
	if !strings.Contains(r.header.Get("Warning"), "stripped") {
		t.Errorf("the plugin's warning is lost: Warning %q", r.header.Get("Warning"))
	}
}

// TestPluginLimit: a project keeps at most plugins.DefaultMaxPlugins plugins; the next is a
// 409 that names the limit and what to do, and stores nothing; a delete makes room.
func TestPluginLimit(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, withDecisionPoints(t, rdb))
	put := func(name string, i int) response {
		wasm := wasmtest.ConstPlugin(fmt.Sprintf(`{"allow":true,"warnings":["%d"]}`, i))
		return e.do("PUT", "/v1/plugins/"+name+"?points=admission", e.key, wasm, "Content-Type", "application/wasm")
	}
	for i := range plugins.DefaultMaxPlugins {
		if r := put(fmt.Sprintf("p%d", i), i); r.status != 201 {
			t.Fatalf("plugin %d: %d %s", i, r.status, r.body)
		}
	}
	msg := expectError(t, put("one_more", 99), 409, "invalid_state", "")
	if want := fmt.Sprintf("%d plugins", plugins.DefaultMaxPlugins); !strings.Contains(msg, want) || !strings.Contains(msg, "DELETE /v1/plugins/{name}") {
		t.Fatalf("the refusal %q does not name the limit (%s) and what to do", msg, want)
	}
	var list struct{ Data []Plugin }
	e.mustDo("GET", "/v1/plugins", e.key, nil, 200, &list)
	if len(list.Data) != plugins.DefaultMaxPlugins {
		t.Fatalf("%d plugins listed, want %d", len(list.Data), plugins.DefaultMaxPlugins)
	}
	e.mustDo("DELETE", "/v1/plugins/p0", e.key, nil, 200, nil)
	if r := put("one_more", 99); r.status != 201 {
		t.Fatalf("after a delete: %d %s", r.status, r.body)
	}
}

// TestPolicyLimits: each policy keeps its newest policies.DefaultMaxVersions versions, and
// GET /v1/policies/{name} answers those; a project has at most policies.DefaultMaxPolicies
// names, and the next is a 409 that names the limit and what to do.
func TestPolicyLimits(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, withDecisionPoints(t, rdb))
	const versions = policies.DefaultMaxVersions + 1
	for range versions {
		if r := e.putPolicy(e.key, "tier4", "enforce", tier4Policy); r.status != 201 {
			t.Fatalf("PUT: %d %s", r.status, r.body)
		}
	}
	var list struct{ Data []Policy }
	e.mustDo("GET", "/v1/policies/tier4", e.key, nil, 200, &list)
	if n := len(list.Data); n != policies.DefaultMaxVersions || list.Data[0].ID != policies.FormatID("tier4", versions) ||
		list.Data[n-1].ID != policies.FormatID("tier4", 2) {
		t.Fatalf("%d versions listed, newest %s, oldest %s; want the newest %d", n, list.Data[0].ID, list.Data[n-1].ID, policies.DefaultMaxVersions)
	}
	expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "policy_id": "pol_tier4@1"}), 400, "invalid_request", "policy_id")

	for i := 1; i < policies.DefaultMaxPolicies; i++ {
		if r := e.putPolicy(e.key, fmt.Sprintf("p%d", i), "enforce", tier4Policy); r.status != 201 {
			t.Fatalf("policy %d: %d %s", i, r.status, r.body)
		}
	}
	msg := expectError(t, e.putPolicy(e.key, "one_more", "enforce", tier4Policy), 409, "invalid_state", "")
	if want := fmt.Sprintf("%d policies", policies.DefaultMaxPolicies); !strings.Contains(msg, want) || !strings.Contains(msg, "PUT /v1/policies/{name}") {
		t.Fatalf("the refusal %q does not name the limit (%s) and what to do", msg, want)
	}
	e.mustDo("GET", "/v1/policies", e.key, nil, 200, &list)
	if len(list.Data) != policies.DefaultMaxPolicies {
		t.Fatalf("%d policies listed, want %d", len(list.Data), policies.DefaultMaxPolicies)
	}
	expectError(t, e.do("GET", "/v1/policies/one_more", e.key, nil), 404, "not_found", "")
	if r := e.putPolicy(e.key, "p1", "warn", tier4Policy); r.status != 201 {
		t.Fatalf("a new version at the limit: %d %s", r.status, r.body)
	}
}
