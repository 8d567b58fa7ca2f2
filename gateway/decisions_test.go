package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"wb/plugins"
	"wb/policies"
	"wb/session"
)

const tier4Policy = `package wb.admission

deny contains "tier 4 needs a plan" if {
	input.request.tier == 4
	not input.request.metadata.plan
}
`

func withDecisionPoints(t *testing.T) envOpt {
	return func(c *Config) {
		ctx := context.Background()
		pol, err := policies.New(ctx, c.Store.Redis(), policies.Options{})
		if err != nil {
			t.Fatal(err)
		}
		host, err := plugins.NewHost(ctx, c.Store.Redis(), plugins.Options{Timeout: time.Second})
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
	e := newEnv(t, withDecisionPoints(t))
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
				deadline := time.Now().Add(5 * time.Second)
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
	e := newEnv(t, withDecisionPoints(t))
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

// Any deny wins and the reasons of every decider are returned.
func TestChainPrecedence(t *testing.T) {
	d := Combine(
		session.Decision{Allow: false, Reasons: []string{"pol_a@1: no"}, Decider: "policy pol_a@1"},
		session.Decision{Allow: true, Warnings: []string{"careful"}, Decider: "plugin ok", Patch: map[string]any{"metadata": map[string]any{"a": "1"}}},
		session.Decision{Allow: false, Reasons: []string{"tier too high"}, Decider: "plugin cap", Patch: map[string]any{"metadata": map[string]any{"b": "2"}}},
	)
	if d.Allow || len(d.Reasons) != 2 || d.Reasons[1] != "plugin cap: tier too high" || d.Warnings[0] != "careful" {
		t.Fatalf("%+v", d)
	}
	if m := d.Patch["metadata"].(map[string]any); m["a"] != "1" || m["b"] != "2" {
		t.Fatalf("patches did not merge: %v", d.Patch)
	}
	if all := Combine(session.Decision{Allow: true}, session.Decision{Allow: true}); !all.Allow {
		t.Fatal("two allows denied")
	}
}
