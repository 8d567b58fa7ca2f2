package policies

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

func newEngine(t *testing.T, rdb redis.UniversalClient, o Options) *Engine {
	t.Helper()
	if rdb == nil {
		rdb = redistest.Server(t)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	e, err := New(context.Background(), rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

func admission(project string, tier int, meta map[string]string) session.AdmissionInput {
	return session.AdmissionInput{
		Request:   session.CreateRequest{Tier: &tier, Template: "tpl_dev_polyglot", Metadata: meta},
		ProjectID: project,
		Plan:      session.Plan{Concurrency: 10, RatePerSec: 5},
	}
}

// decisions flushes the engine's log and answers the project's stream.
func decisions(t *testing.T, e *Engine, project string) []map[string]any {
	t.Helper()
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	msgs, err := e.rdb.XRange(context.Background(), DecisionsKey(project), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		out[i] = m.Values
	}
	return out
}

func TestAdmitShipped(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})

	d, err := e.Admit(ctx, admission("proj_a", 2, nil))
	if err != nil {
		t.Fatal(err)
	}
	want := session.Decision{Allow: true, Decider: "platform"}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("plain create: %+v, want %+v", d, want)
	}

	full := admission("proj_a", 2, nil)
	full.Active = 10
	d, err = e.Admit(ctx, full)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allow || !slices.Equal(d.Reasons, []string{"concurrency limit reached: 10 of 10 sessions active"}) || d.Decider != "platform" {
		t.Errorf("at the limit: %+v", d)
	}

	busy := admission("proj_a", 4, nil)
	busy.Active = 8
	d, err = e.Admit(ctx, busy)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allow || !slices.Equal(d.Warnings, []string{"concurrency at 9 of 10 sessions (80% soft limit)"}) ||
		!reflect.DeepEqual(d.Patch, map[string]any{"idle_timeout_s": json.Number("120")}) {
		t.Errorf("busy tier 4: %+v", d)
	}
}

const tier4Policy = `package wb.admission

deny contains "tier 4 needs a plan" if {
	input.request.tier == 4
	not input.request.metadata.plan
}
`

func TestModes(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	e := newEngine(t, rdb, Options{})
	for _, mode := range []Mode{ModeEnforce, ModeWarn, ModeDryrun} {
		project := "proj_" + string(mode)
		v, err := e.Put(ctx, project, "tier4", tier4Policy, mode)
		if err != nil {
			t.Fatal(err)
		}
		if v.ID != "pol_tier4@1" || v.Point != PointAdmission || v.Mode != mode || !strings.HasPrefix(v.Digest, "sha256:") {
			t.Errorf("%s: version %+v", mode, v)
		}
		// Tier 2, or tier 4 with a plan: no policy objects.
		for _, in := range []session.AdmissionInput{
			admission(project, 2, nil), admission(project, 4, map[string]string{"plan": "pro"}),
		} {
			d, err := e.Admit(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allow || len(d.Reasons) > 0 || len(d.Warnings) > 0 {
				t.Errorf("%s, tier %d: %+v", mode, *in.Request.Tier, d)
			}
		}
	}

	d, err := e.Admit(ctx, admission("proj_enforce", 4, map[string]string{"team": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if d.Allow || !slices.Equal(d.Reasons, []string{"pol_tier4@1: tier 4 needs a plan"}) || d.Decider != "policy pol_tier4@1" {
		t.Errorf("enforce: %+v", d)
	}

	d, err = e.Admit(ctx, admission("proj_warn", 4, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allow || len(d.Reasons) > 0 || !slices.Equal(d.Warnings, []string{"pol_tier4@1: warn mode, would deny: tier 4 needs a plan"}) {
		t.Errorf("warn: %+v", d)
	}
	if d.Decider != "platform, policy pol_tier4@1" {
		t.Errorf("warn decider %q", d.Decider)
	}

	d, err = e.Admit(ctx, admission("proj_dryrun", 4, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allow || len(d.Reasons) > 0 || len(d.Warnings) > 0 {
		t.Errorf("dryrun: %+v", d)
	}

	log := decisions(t, e, "proj_dryrun")
	if len(log) != 3 {
		t.Fatalf("dryrun project logged %d decisions, want 3", len(log))
	}
	last := log[2]
	if last["point"] != PointAdmission || last["outcome"] != "allow; would deny: pol_tier4@1" {
		t.Errorf("dryrun log entry: %v", last)
	}
	var outs []Outcome
	if err := json.Unmarshal([]byte(last["policies"].(string)), &outs); err != nil {
		t.Fatal(err)
	}
	wantOuts := []Outcome{
		{Policy: "platform", Mode: ModeEnforce, Outcome: "allow"},
		{Policy: "pol_tier4@1", Mode: ModeDryrun, Outcome: "would deny"},
	}
	if !reflect.DeepEqual(outs, wantOuts) {
		t.Errorf("dryrun outcomes %+v, want %+v", outs, wantOuts)
	}
	if !strings.HasPrefix(last["input_digest"].(string), "sha256:") || last["duration_us"] == "" {
		t.Errorf("dryrun log entry: %v", last)
	}
	var res session.Decision
	if err := json.Unmarshal([]byte(last["result"].(string)), &res); err != nil || !res.Allow {
		t.Errorf("dryrun logged result %q (%v)", last["result"], err)
	}
}

func TestCompileErrors(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	for _, tc := range []struct {
		name, src string
		row, col  int
		msg       string
	}{
		{"syntax", "package wb.admission\n\ndeny contains msg if {\n\tmsg := \"a\" +\n}\n", 5, 1, "rego_parse_error: unexpected } token"},
		{"unsafe", "package wb.admission\n\ndeny contains msg if {\n\tx > 1\n\tmsg := \"x\"\n}\n", 4, 2, "var x is unsafe"},
		{"no_package", "deny contains \"x\" if {\n\ttrue\n}\n", 1, 1, "package expected"},
		{"other_package", "package wb.billing\n\ndeny contains \"x\" if true\n", 1, 1, "package wb.billing is not a decision point"},
		{"sub_package", "package wb.admission.extra\n\ndeny contains \"x\" if true\n", 1, 1, "not a decision point"},
		{"http_send", "package wb.admission\n\ndeny contains msg if {\n\tr := http.send({\"method\": \"get\", \"url\": \"http://169.254.169.254/\"})\n\tmsg := r.body\n}\n", 4, 7, "undefined function http.send"},
		{"masked_not_constant", "package wb.admission\n\nmasked := [input.x]\n", 3, 1, "masked must be a constant array of strings"},
		{"empty", "", 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Put(ctx, "proj_c", "bad", tc.src, ModeEnforce)
			var ce *CompileError
			if !errors.As(err, &ce) {
				t.Fatalf("Put: %v (%T), want *CompileError", err, err)
			}
			if len(ce.Errors) == 0 {
				t.Fatal("no errors")
			}
			first := ce.Errors[0]
			if tc.row > 0 && (first.Row != tc.row || first.Col != tc.col) {
				t.Errorf("at %d:%d, want %d:%d (%v)", first.Row, first.Col, tc.row, tc.col, err)
			}
			if !strings.Contains(first.Message, tc.msg) {
				t.Errorf("message %q, want it to contain %q", first.Message, tc.msg)
			}
			if tc.row > 0 && !strings.Contains(err.Error(), fmt.Sprintf("line %d, column %d: ", tc.row, tc.col)) {
				t.Errorf("Error() = %q does not name the line and column", err)
			}
			t.Log(err)
		})
	}
	if _, err := e.Versions(ctx, "proj_c", "bad"); !errors.Is(err, ErrNotFound) {
		t.Errorf("rejected policies were stored: %v", err)
	}
	for _, bad := range []struct{ name, mode string }{{"Bad-Name", "enforce"}, {"", "enforce"}, {strings.Repeat("a", 65), "enforce"}, {"ok", "audit"}} {
		if _, err := e.Put(ctx, "proj_c", bad.name, tier4Policy, Mode(bad.mode)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Put(%q, %q): %v, want ErrInvalid", bad.name, bad.mode, err)
		}
	}
}

const runtimeV1 = `package wb.runtime

kill contains "no_curl" if {
	input.type == "exec"
	input.argv[0] == "curl"
}
`

const runtimeV2 = `package wb.runtime

allow_egress if {
	input.type == "egress"
	input.host == "pypi.org"
	input.port == 443
}
`

// TestChangedDigestIsNotServed: a cached revision whose stored record changed behind the
// engine (a Redis restored from a backup, or failed over, that numbered a version again) is
// compiled again from the stored source, for a session's pinned version as for the latest one
// (Options.Refresh after the record was last read). The pinned one was served from the cache
// whatever Redis held, and a load kept the latest one of the same number.
func TestChangedDigestIsNotServed(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	const refresh = 50 * time.Millisecond
	e := newEngine(t, rdb, Options{Refresh: refresh})
	const p = "proj_digest"
	rt, err := e.Put(ctx, p, "rt", runtimeV1, ModeEnforce)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Put(ctx, p, "gate", tier4Policy, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	curl := map[string]any{"type": "exec", "argv": []any{"curl", "https://example.com"}, "session": map[string]any{"id": "sess_1", "tier": 2}}
	kills := func() bool {
		t.Helper()
		d, err := e.Runtime(ctx, p, rt.ID, curl)
		if err != nil || d.Deny {
			t.Fatalf("runtime: %+v %v", d, err)
		}
		return d.Kill
	}
	denies := func() bool {
		t.Helper()
		d, err := e.Admit(ctx, admission(p, 4, nil))
		if err != nil {
			t.Fatal(err)
		}
		return !d.Allow
	}
	if !kills() || !denies() {
		t.Fatal("the policies do not apply as stored")
	}
	// Behind the engine, both version 1 records now hold other sources.
	rewrite := func(name, source string) {
		t.Helper()
		raw, err := rdb.HGet(ctx, versionsKey(p, name), "1").Bytes()
		if err != nil {
			t.Fatal(err)
		}
		var rec record
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		rec.Source, rec.Digest = source, digest(source)
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.HSet(ctx, versionsKey(p, name), "1", b).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rewrite("rt", runtimeV2)
	rewrite("gate", strings.Replace(tier4Policy, "== 4", "== 3", 1))
	time.Sleep(2 * refresh)
	if kills() {
		t.Error("the pinned version was served from the cache after its stored digest changed")
	}
	if denies() {
		t.Error("the latest version was kept from the loaded set after its stored digest changed")
	}
}

func TestVersionsAndPinning(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	e := newEngine(t, rdb, Options{})
	v1, err := e.Put(ctx, "proj_p", "build_tools", runtimeV1, ModeEnforce)
	if err != nil {
		t.Fatal(err)
	}
	curl := map[string]any{"type": "exec", "argv": []any{"curl", "https://example.com"}, "session": map[string]any{"id": "sess_1", "tier": 2}}
	d, err := e.Runtime(ctx, "proj_p", v1.ID, curl)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Kill || d.Rule != "no_curl" || d.Decider != "policy pol_build_tools@1" {
		t.Errorf("@1 on curl: %+v", d)
	}

	v2, err := e.Put(ctx, "proj_p", "build_tools", runtimeV2, ModeEnforce)
	if err != nil {
		t.Fatal(err)
	}
	if v2.ID != "pol_build_tools@2" || v2.Version != 2 || v2.Digest == v1.Digest || v2.Point != PointRuntime {
		t.Errorf("second version %+v", v2)
	}
	other, err := e.Put(ctx, "proj_p", "gate", tier4Policy, ModeWarn)
	if err != nil {
		t.Fatal(err)
	}

	vs, err := e.Versions(ctx, "proj_p", "build_tools")
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 2 || !reflect.DeepEqual(vs[0], v1) || !reflect.DeepEqual(vs[1], v2) {
		t.Errorf("Versions: %+v", vs)
	}
	ps, err := e.Policies(ctx, "proj_p")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || !reflect.DeepEqual(ps[0], v2) || !reflect.DeepEqual(ps[1], other) {
		t.Errorf("Policies: %+v", ps)
	}
	got, src, err := e.Get(ctx, "proj_p", "pol_build_tools@1")
	if err != nil || src != runtimeV1 || !reflect.DeepEqual(got, v1) {
		t.Errorf("Get @1: %+v %q %v", got, src, err)
	}
	got, src, err = e.Get(ctx, "proj_p", "pol_build_tools")
	if err != nil || src != runtimeV2 || got.ID != v2.ID {
		t.Errorf("Get latest: %+v %q %v", got, src, err)
	}
	for _, id := range []string{"pol_build_tools@3", "pol_nope", "pol_nope@1"} {
		if _, _, err := e.Get(ctx, "proj_p", id); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get %s: %v, want ErrNotFound", id, err)
		}
	}
	if _, _, err := e.Get(ctx, "proj_p", "build_tools@1"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Get without pol_: %v, want ErrInvalid", err)
	}

	// The session pinned to @1 keeps @1 after @2 exists, on this engine and on another.
	fresh := newEngine(t, rdb, Options{})
	for name, eng := range map[string]*Engine{"same engine": e, "other engine": fresh} {
		d, err := eng.Runtime(ctx, "proj_p", "pol_build_tools@1", curl)
		if err != nil || !d.Kill || d.Rule != "no_curl" {
			t.Errorf("%s: @1 after @2 on curl: %+v %v", name, d, err)
		}
		d, err = eng.Runtime(ctx, "proj_p", "pol_build_tools@2", curl)
		if err != nil || d.Kill {
			t.Errorf("%s: @2 on curl: %+v %v", name, d, err)
		}
		pypi := map[string]any{"type": "egress", "host": "pypi.org", "port": 443}
		if d, err := eng.Runtime(ctx, "proj_p", "pol_build_tools@1", pypi); err != nil || d.AllowEgress {
			t.Errorf("%s: @1 on pypi egress: %+v %v", name, d, err)
		}
		if d, err := eng.Runtime(ctx, "proj_p", "pol_build_tools@2", pypi); err != nil || !d.AllowEgress {
			t.Errorf("%s: @2 on pypi egress: %+v %v", name, d, err)
		}
	}
	// A pinned id that cannot be used refuses every event (fail closed) without an error.
	for id, want := range map[string]string{
		"pol_build_tools":   "must pin a version",
		"pol_build_tools@9": ErrNotFound.Error(),
		other.ID:            "not a runtime one",
	} {
		d, err := e.Runtime(ctx, "proj_p", id, curl)
		if err != nil || !d.Deny || d.Kill || d.AllowEgress || !strings.Contains(d.DenyReason, want) {
			t.Errorf("Runtime pinned to %s: %+v %v, want a deny naming %q", id, d, err, want)
		}
	}
}

func TestRuntimeShipped(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	sess := map[string]any{"id": "sess_1", "tier": 2, "end_user_id": "eu_1"}
	for _, tc := range []struct {
		event map[string]any
		want  RuntimeDecision
	}{
		{map[string]any{"type": "egress", "host": "169.254.169.254", "port": 80, "session": sess},
			RuntimeDecision{Kill: true, Rule: "metadata_egress", Message: "egress to the cloud metadata endpoint 169.254.169.254:80", Decider: "platform"}},
		{map[string]any{"type": "process_start", "argv": []string{"/usr/bin/xmrig"}, "session": sess},
			RuntimeDecision{Kill: true, Rule: "crypto_miner", Message: `crypto miner "xmrig" started`, Decider: "platform"}},
		{map[string]any{"type": "egress", "host": "pypi.org", "port": 443, "session": sess},
			RuntimeDecision{Decider: "platform"}},
		{map[string]any{"type": "resource_sample", "cpu_ms": 10, "memory_bytes": int64(1) << 30, "session": sess},
			RuntimeDecision{Decider: "platform"}},
		{nil, RuntimeDecision{Decider: "platform"}},
	} {
		d, err := e.Runtime(ctx, "proj_r", "", tc.event)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(d, tc.want) {
			t.Errorf("%v: %+v, want %+v", tc.event, d, tc.want)
		}
	}
	if _, err := e.Runtime(ctx, "proj_r", "", map[string]any{"type": "exec", "bad": make(chan int)}); err == nil {
		t.Error("an unencodable event was accepted")
	}

	// Modes at runtime: warn turns a kill into a warning, dryrun grants nothing.
	for _, mode := range []Mode{ModeWarn, ModeDryrun} {
		src := runtimeV1 + "\nallow_egress if input.host == \"pypi.org\"\n"
		v, err := e.Put(ctx, "proj_r", "m_"+string(mode), src, mode)
		if err != nil {
			t.Fatal(err)
		}
		d, err := e.Runtime(ctx, "proj_r", v.ID, map[string]any{"type": "exec", "argv": []any{"curl"}})
		if err != nil || d.Kill {
			t.Errorf("%s on curl: %+v %v", mode, d, err)
		}
		if mode == ModeWarn && !slices.Equal(d.Warnings, []string{"pol_m_warn@1 (warn mode, would kill no_curl): no_curl"}) {
			t.Errorf("warn on curl: %+v", d)
		}
		d, err = e.Runtime(ctx, "proj_r", v.ID, map[string]any{"type": "egress", "host": "pypi.org", "port": 443})
		if err != nil || d.AllowEgress != (mode == ModeWarn) {
			t.Errorf("%s on pypi egress: %+v %v", mode, d, err)
		}
	}
	// A project policy cannot grant egress the platform kills.
	v, err := e.Put(ctx, "proj_r", "open", "package wb.runtime\n\nallow_egress := true\n", ModeEnforce)
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.Runtime(ctx, "proj_r", v.ID, map[string]any{"type": "egress", "host": "169.254.169.254", "port": 80})
	if err != nil || !d.Kill || d.AllowEgress || d.Rule != "metadata_egress" || d.Decider != "platform" {
		t.Errorf("metadata egress under an open policy: %+v %v", d, err)
	}
}

func TestSpend(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	caps := map[string]any{"monthly_spend_cap_micro_usd": 100_000_000, "end_user_monthly_spend_cap_micro_usd": 5_000_000}
	in := func(project, endUser int) map[string]any {
		return map[string]any{"project_spend_micro_usd": project, "end_user_spend_micro_usd": endUser,
			"end_user_id": "eu_1", "caps": caps, "plan": map[string]any{"concurrency": 10, "rate_per_sec": 5}}
	}
	for _, tc := range []struct {
		in   map[string]any
		want SpendDecision
	}{
		{in(1, 1), SpendDecision{Decider: "platform"}},
		{in(90_000_000, 1), SpendDecision{Warnings: []string{"project spend at 90% of its monthly cap"}, Decider: "platform"}},
		{in(100_000_000, 1), SpendDecision{StopScope: ScopeProject, DenyAdmission: true, Decider: "platform"}},
		{in(1, 5_000_001), SpendDecision{StopScope: ScopeEndUser, DenyAdmission: true, Decider: "platform"}},
		{nil, SpendDecision{Decider: "platform"}},
	} {
		d, err := e.Spend(ctx, "proj_s", tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(d, tc.want) {
			t.Errorf("%v: %+v, want %+v", tc.in, d, tc.want)
		}
	}
	// A project's own, tighter end-user cap, in warn mode then enforce.
	src := `package wb.spend

stop_sessions := "end_user" if input.end_user_spend_micro_usd > 1000000
`
	if _, err := e.Put(ctx, "proj_s", "tight", src, ModeWarn); err != nil {
		t.Fatal(err)
	}
	d, err := e.Spend(ctx, "proj_s", in(1, 2_000_000))
	if err != nil {
		t.Fatal(err)
	}
	if d.StopScope != "" || !slices.Equal(d.Warnings, []string{"pol_tight@1: warn mode, would stop end_user"}) {
		t.Errorf("warn: %+v", d)
	}
	if _, err := e.Put(ctx, "proj_s", "tight", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err = e.Spend(ctx, "proj_s", in(1, 2_000_000))
	if err != nil || d.StopScope != ScopeEndUser || d.DenyAdmission || d.Decider != "policy pol_tight@2" {
		t.Errorf("enforce: %+v %v", d, err)
	}
	// The platform's project stop is wider than the policy's end-user one.
	d, err = e.Spend(ctx, "proj_s", in(200_000_000, 2_000_000))
	if err != nil || d.StopScope != ScopeProject || !d.DenyAdmission || d.Decider != "platform, policy pol_tight@2" {
		t.Errorf("both: %+v %v", d, err)
	}
}

func TestMasking(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	src := `package wb.admission

masked := ["request.metadata.secret", "input.request.metadata.token", "request.nope.deeper"]

warn contains "saw a secret" if input.request.metadata.secret
`
	v, err := e.Put(ctx, "proj_m", "secrets", src, ModeEnforce)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(v.Masked, []string{"request.metadata.secret", "request.metadata.token", "request.nope.deeper"}) {
		t.Errorf("masked %v", v.Masked)
	}
	d, err := e.Admit(ctx, admission("proj_m", 2, map[string]string{"secret": "hunter2", "token": "tok_9f3c", "team": "blue"}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Warnings, []string{"pol_secrets@1: saw a secret"}) {
		t.Errorf("the policy saw %+v", d)
	}
	log := decisions(t, e, "proj_m")
	if len(log) != 1 {
		t.Fatalf("%d entries", len(log))
	}
	in := log[0]["input"].(string)
	if strings.Contains(in, "hunter2") || strings.Contains(in, "tok_9f3c") {
		t.Errorf("logged input leaks a masked value: %s", in)
	}
	var got session.AdmissionInput
	if err := json.Unmarshal([]byte(in), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"secret": "***", "token": "***", "team": "blue"}
	if !reflect.DeepEqual(got.Request.Metadata, want) || got.ProjectID != "proj_m" {
		t.Errorf("logged input %s", in)
	}
}

func TestMaskedJSON(t *testing.T) {
	v, err := ast.InterfaceToValue(map[string]any{
		"a": map[string]any{"b": "x", "c": []any{map[string]any{"k": 1}, map[string]any{"k": 2.5}}},
		"d": "keep \"quoted\"\n\x01 \xff é",
		"e": map[string]any{"f": "x", "g": []any{true, nil}},
		"h": []any{"0", "1", "2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	set := ast.NewObject(ast.Item(ast.StringTerm("s"), ast.SetTerm(ast.StringTerm("b"), ast.StringTerm("a"))))
	for _, tc := range []struct {
		v     ast.Value
		paths []string
		want  string
	}{
		{v, nil, `{"a":{"b":"x","c":[{"k":1},{"k":2.5}]},"d":"keep \"quoted\"\n\u0001 \ufffd é","e":{"f":"x","g":[true,null]},"h":["0","1","2"]}`},
		{v, []string{"a.b", "a.c.*.k", "e.*", "missing.x", "d.too.deep", "h.1", "h.7"},
			`{"a":{"b":"***","c":[{"k":"***"},{"k":"***"}]},"d":"keep \"quoted\"\n\u0001 \ufffd é","e":{"f":"***","g":"***"},"h":["0","***","2"]}`},
		{v, []string{"a"}, `{"a":"***","d":"keep \"quoted\"\n\u0001 \ufffd é","e":{"f":"x","g":[true,null]},"h":["0","1","2"]}`},
		{set, nil, `{"s":["a","b"]}`},
	} {
		got := string(maskedJSON(tc.v, tc.paths))
		if got != tc.want {
			t.Errorf("masked %v:\n got %s\nwant %s", tc.paths, got, tc.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("not JSON: %s", got)
		}
	}
}

func TestPolicyFailures(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 50 * time.Millisecond})
	conflict := `package wb.admission

tier := "a" if input.active_sessions >= 0

tier := "b" if input.active_sessions >= 0

deny contains "tier c" if tier == "c"
`
	slow := `package wb.admission

deny contains "never" if {
	some i in numbers.range(1, 20000)
	some j in numbers.range(1, 20000)
	i * j < 0
}
`
	for _, tc := range []struct{ name, src string }{{"conflict", conflict}, {"slow", slow}} {
		t.Run(tc.name, func(t *testing.T) {
			project := "proj_f_" + tc.name
			if _, err := e.Put(ctx, project, tc.name, tc.src, ModeEnforce); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			d, err := e.Admit(ctx, admission(project, 2, nil))
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow || len(d.Reasons) != 1 || !strings.HasPrefix(d.Reasons[0], "pol_"+tc.name+"@1: evaluation failed: ") {
				t.Errorf("%+v", d)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("took %v", el)
			}
			t.Log(d.Reasons)
		})
	}
}

// blockingHandler blocks the decision log's writer inside its first "policy decision"
// record until release is closed.
type blockingHandler struct {
	entered chan struct{}
	once    *sync.Once
	release chan struct{}
}

func (h blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "policy decision" {
		h.once.Do(func() { close(h.entered) })
		<-h.release
	}
	return nil
}
func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h blockingHandler) WithGroup(string) slog.Handler      { return h }

func TestDecisionLogDrops(t *testing.T) {
	ctx := context.Background()
	h := blockingHandler{entered: make(chan struct{}), once: &sync.Once{}, release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(h.release) }) }
	t.Cleanup(release)
	reg := prometheus.NewRegistry()
	e := newEngine(t, nil, Options{Logger: slog.New(h), Metrics: reg, DecisionLog: DecisionLogOptions{Buffer: 2}})

	if _, err := e.Admit(ctx, admission("proj_d", 2, nil)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the decision log never wrote")
	}
	for range 9 { // 2 fit the buffer, 7 are dropped
		if _, err := e.Admit(ctx, admission("proj_d", 2, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.Dropped(); got != 7 {
		t.Errorf("Dropped() = %d, want 7", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var metric float64 = -1
	for _, mf := range mfs {
		if mf.GetName() == "wb_policy_decision_log_dropped_total" {
			metric = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if metric != 7 {
		t.Errorf("wb_policy_decision_log_dropped_total = %v, want 7", metric)
	}
	release()
	if log := decisions(t, e, "proj_d"); len(log) != 3 {
		t.Errorf("%d entries written, want 3 (1 in flight + 2 buffered)", len(log))
	}
	// After Close, decisions still answer; their entries count as dropped.
	if _, err := e.Admit(ctx, admission("proj_d", 2, nil)); err != nil {
		t.Fatal(err)
	}
	if got := e.Dropped(); got != 8 {
		t.Errorf("Dropped() after Close = %d, want 8", got)
	}
	// A second engine on the same registry shares the counter.
	e2 := newEngine(t, e.rdb, Options{Metrics: reg})
	_ = e2.Close(ctx)
	if _, err := e2.Admit(ctx, admission("proj_d", 2, nil)); err != nil {
		t.Fatal(err)
	}
	mfs, _ = reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "wb_policy_decision_log_dropped_total" && mf.GetMetric()[0].GetCounter().GetValue() != 9 {
			t.Errorf("shared counter = %v, want 9", mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
}

// lockedBuffer is a bytes.Buffer for a logger written by the decision log's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDecisionLogEntryBounded: a policy saying 64 deny and 64 warn messages of 1 KiB each (the
// most the answer keeps) still makes a decision-log entry, in the stream and in slog, of at most
// maxResultBytes of result: the messages that fit, a truncated mark and the counts. The
// stream keeps ~10,000 entries per project, so unbounded entries would take gigabytes.
func TestDecisionLogEntryBounded(t *testing.T) {
	ctx := context.Background()
	var logged lockedBuffer
	// 200 messages of 1 KiB take 0.2–0.4 s under -race alone: the default 250 ms failed it
	// closed on a loaded machine ("1 reasons").
	e := newEngine(t, nil, Options{EvalTimeout: 10 * time.Second, Logger: slog.New(slog.NewJSONHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	const project = "proj_loud"
	src := `package wb.admission

deny contains sprintf("%d %s", [i, concat("", [s | some _ in numbers.range(1, 40); s := "xxxxxxxxxxxxxxxxxxxxxxxxx"])]) if some i in numbers.range(1, 100)

warn contains sprintf("%d %s", [i, concat("", [s | some _ in numbers.range(1, 40); s := "yyyyyyyyyyyyyyyyyyyyyyyyy"])]) if some i in numbers.range(1, 100)
`
	if _, err := e.Put(ctx, project, "loud", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission(project, 2, nil))
	if err != nil {
		t.Fatal(err)
	}
	if d.Allow || len(d.Reasons) != maxMessages+1 || len(d.Warnings) != maxMessages+1 {
		t.Fatalf("the answer keeps %d reasons and %d warnings (allow=%v; %.200q), want %d each", len(d.Reasons), len(d.Warnings), d.Allow, d.Reasons, maxMessages+1)
	}
	entries := decisions(t, e, project)
	if len(entries) != 1 {
		t.Fatalf("%d entries", len(entries))
	}
	res, _ := entries[0]["result"].(string)
	if len(res) > maxResultBytes {
		t.Errorf("the entry's result is %d bytes, want at most %d", len(res), maxResultBytes)
	}
	var got struct {
		Allow         bool     `json:"allow"`
		Truncated     bool     `json:"truncated"`
		Reasons       []string `json:"reasons"`
		ReasonsCount  int      `json:"reasons_count"`
		WarningsCount int      `json:"warnings_count"`
	}
	if err := json.Unmarshal([]byte(res), &got); err != nil {
		t.Fatalf("result %.200s: %v", res, err)
	}
	if !got.Truncated || got.Allow || len(got.Reasons) == 0 || got.ReasonsCount != maxMessages+1 || got.WarningsCount != maxMessages+1 {
		t.Errorf("result %+v, want truncated with the first reasons and the counts %d", got, maxMessages+1)
	}
	for line := range strings.Lines(logged.String()) {
		if strings.Contains(line, `"msg":"policy decision"`) && len(line) > maxResultBytes+4<<10 {
			t.Errorf("the slog line of the decision is %d bytes", len(line))
		}
	}
}

func hotPolicy(n int) string {
	return fmt.Sprintf("package wb.admission\n\nwarn contains \"revision %d\" if true\n", n)
}

// TestHotReload uploads a new version while 1,000 goroutines call Admit concurrently (each
// until the upload has returned or 10 times, then once more after it returned): no call fails, each decision carries
// exactly one revision's marker, and once Put returned this engine answers with the new one.
func TestHotReload(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	// 1,000 goroutines on a couple of cores stretch a decision's wall time far beyond the
	// default EvalTimeout; the timeout is not what this test is about.
	e := newEngine(t, rdb, Options{EvalTimeout: time.Minute})
	other := newEngine(t, rdb, Options{EvalTimeout: time.Minute, Refresh: 20 * time.Millisecond}) // sees the upload via Redis
	if _, err := e.Put(ctx, "proj_h", "marker", hotPolicy(1), ModeEnforce); err != nil {
		t.Fatal(err)
	}
	const workers = 1000
	const v1, v2 = "pol_marker@1: revision 1", "pol_marker@2: revision 2"
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		putDone = make(chan struct{})
		mu      sync.Mutex
		seen    = map[string]map[string]int{"e": {}, "other": {}}
		calls   int
		failed  []string
	)
	admit := func(eng *Engine, which string) (string, bool) {
		d, err := eng.Admit(ctx, admission("proj_h", 2, nil))
		var markers []string
		for _, w := range d.Warnings {
			if strings.Contains(w, "revision ") {
				markers = append(markers, w)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		switch {
		case err != nil:
			failed = append(failed, err.Error())
		case !d.Allow || len(markers) != 1 || (markers[0] != v1 && markers[0] != v2):
			failed = append(failed, fmt.Sprintf("%+v", d))
		default:
			seen[which][markers[0]]++
			return markers[0], true
		}
		return "", false
	}
	for i := range workers {
		eng, which := e, "e"
		if i%4 == 3 {
			eng, which = other, "other"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 10 {
				admit(eng, which)
				select {
				case <-putDone:
				default:
					continue
				}
				break
			}
			<-putDone
			if m, ok := admit(eng, which); ok && which == "e" && m != v2 {
				mu.Lock()
				failed = append(failed, "a decision after Put returned used "+m)
				mu.Unlock()
			}
		}()
	}
	putErr := make(chan error, 1)
	go func() {
		<-start
		for { // upload once decisions are flowing
			mu.Lock()
			n := calls
			mu.Unlock()
			if n >= 200 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		_, err := e.Put(ctx, "proj_h", "marker", hotPolicy(2), ModeEnforce)
		close(putDone)
		putErr <- err
	}()
	close(start)
	wg.Wait()
	if err := <-putErr; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d decisions; markers: %v", calls, seen)
	if len(failed) > 0 {
		t.Fatalf("%d of %d decisions failed, e.g. %s", len(failed), calls, failed[0])
	}
	if seen["e"][v1] == 0 || seen["e"][v2] == 0 {
		t.Errorf("the upload did not land during the calls: %v", seen["e"])
	}
	// The other engine refreshes every 20 ms: it answers with the new revision soon after.
	d, err := other.Admit(ctx, admission("proj_h", 2, nil))
	for deadline := time.Now().Add(30 * time.Second); (err != nil || !slices.Equal(d.Warnings, []string{v2})) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		d, err = other.Admit(ctx, admission("proj_h", 2, nil))
	}
	if err != nil || !slices.Equal(d.Warnings, []string{v2}) {
		t.Errorf("other engine 30 s after the upload: %+v %v", d, err)
	}
}

// TestRuntimeFailsClosed: a project runtime policy that fails or runs out of time refuses
// the event (Deny, no egress) and never discards the platform's kill.
func TestRuntimeFailsClosed(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 50 * time.Millisecond})
	slow := `package wb.runtime

allow_egress if {
	some i in numbers.range(1, 20000)
	some j in numbers.range(1, 20000)
	i * j < 0
}

allow_egress if input.type == "egress"
`
	failing := `package wb.runtime

mode := "a" if input.type != ""

mode := "b" if input.type != ""

allow_egress if mode != ""
`
	metadata := map[string]any{"type": "egress", "host": "169.254.169.254", "port": 80}
	pypi := map[string]any{"type": "egress", "host": "pypi.org", "port": 443}
	miner := map[string]any{"type": "exec", "argv": []any{"xmrig"}}
	ls := map[string]any{"type": "exec", "argv": []any{"ls"}}
	for _, tc := range []struct{ name, src, reason string }{
		{"slow", slow, "evaluation failed"},
		{"failing", failing, "evaluation failed"},
	} {
		v, err := e.Put(ctx, "proj_fc", tc.name, tc.src, ModeEnforce)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range []map[string]any{metadata, pypi, miner, ls} {
			start := time.Now()
			d, err := e.Runtime(ctx, "proj_fc", v.ID, ev)
			if err != nil {
				t.Fatalf("%s on %v: %v", tc.name, ev, err)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("%s on %v took %v", tc.name, ev, el)
			}
			if !d.Deny || d.AllowEgress || !strings.Contains(d.DenyReason, v.ID+": "+tc.reason) {
				t.Errorf("%s on %v: %+v, want a deny naming %s", tc.name, ev, d, v.ID)
			}
			wantKill := map[string]string{"169.254.169.254": "metadata_egress", "xmrig": "crypto_miner"}
			rule := ""
			if h, _ := ev["host"].(string); h != "" {
				rule = wantKill[h]
			} else {
				rule = wantKill[ev["argv"].([]any)[0].(string)]
			}
			if d.Kill != (rule != "") || d.Rule != rule {
				t.Errorf("%s on %v: %+v, want the platform's kill %q to stand", tc.name, ev, d, rule)
			}
		}
	}
	// warn mode: the failure is a warning and the event goes on.
	v, err := e.Put(ctx, "proj_fc", "failing_warn", failing, ModeWarn)
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.Runtime(ctx, "proj_fc", v.ID, ls)
	if err != nil || d.Deny || len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "would refuse the event") {
		t.Errorf("warn mode failure: %+v %v", d, err)
	}
	// A pinned policy that cannot be found keeps the platform's kill too.
	d, err = e.Runtime(ctx, "proj_fc", "pol_gone@3", metadata)
	if err != nil || !d.Deny || !d.Kill || d.Rule != "metadata_egress" {
		t.Errorf("missing pinned policy on metadata egress: %+v %v", d, err)
	}
}

// TestForget: an engine whose own refresh would take an hour reads a project's policies again
// at its next decision once told to Forget them (a gateway is told by store.Changes), and
// ForgetAll does the same for every project.
func TestForget(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	a := newEngine(t, rdb, Options{})
	b := newEngine(t, rdb, Options{Refresh: time.Hour})
	marked := func(want string) bool {
		t.Helper()
		d, err := b.Admit(ctx, admission("proj_f", 2, nil))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range d.Warnings {
			if strings.Contains(w, "revision ") {
				return w == want
			}
		}
		return want == ""
	}
	if !marked("") {
		t.Fatal("a marker before any policy")
	}
	for n, forget := range []func(){func() { b.Forget("proj_f") }, b.ForgetAll} {
		if _, err := a.Put(ctx, "proj_f", "marker", hotPolicy(n+1), ModeEnforce); err != nil {
			t.Fatal(err)
		}
		was := ""
		if n > 0 {
			was = fmt.Sprintf("pol_marker@%d: revision %d", n, n)
		}
		if !marked(was) {
			t.Fatalf("revision %d: b read the policies again without being told", n+1)
		}
		forget()
		if want := fmt.Sprintf("pol_marker@%d: revision %d", n+1, n+1); !marked(want) {
			t.Fatalf("after the Forget: not %q", want)
		}
	}
}

// versionNumbers answers the numbers of a policy's stored versions, oldest first.
func versionNumbers(t *testing.T, e *Engine, project, name string) []int {
	t.Helper()
	vs, err := e.Versions(context.Background(), project, name)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, v := range vs {
		out = append(out, v.Version)
	}
	return out
}

// TestPolicyLimits: a project has at most MaxPolicies names (past it, a conflict that says
// what to do, and nothing stored), and each name keeps its newest MaxVersions versions and
// those a live session pinned; a version is trimmed once no live session pins it.
func TestPolicyLimits(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	e := newEngine(t, rdb, Options{MaxPolicies: 3, MaxVersions: 4})
	const p = "proj_lim"
	for _, name := range []string{"a", "b", "c"} {
		if _, err := e.Put(ctx, p, name, tier4Policy, ModeEnforce); err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.Put(ctx, p, "d", tier4Policy, ModeEnforce)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "3 policies") || !strings.Contains(err.Error(), "PUT /v1/policies/{name}") {
		t.Fatalf("a 4th policy: %v", err)
	}
	if ps, err := e.Policies(ctx, p); err != nil || len(ps) != 3 {
		t.Fatalf("after the refusal: %d policies, %v", len(ps), err)
	}
	if _, _, err := e.Get(ctx, p, "pol_d"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the refused policy: %v", err)
	}
	if _, err := e.Put(ctx, "proj_other", "d", tier4Policy, ModeEnforce); err != nil {
		t.Fatalf("another project: %v", err)
	}

	// A live session pins b@2; b@1 is pinned by none.
	st := store.New(rdb)
	if _, err := st.EnsureProject(ctx, p, p); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := e.Put(ctx, p, "b", runtimeV1, ModeEnforce); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	pin := FormatID("b", 2)
	sess := &session.Session{ID: session.NewID("sess_", now), Tier: 2, State: session.Pending, ProjectID: p, Template: "base",
		Region: "local", CreatedAt: *session.At(now), IdleTimeoutS: 60, MaxLifetimeS: 3600, PolicyID: &pin}
	if sess, err = st.Create(ctx, sess, 10); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := e.Put(ctx, p, "b", runtimeV1, ModeEnforce); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := versionNumbers(t, e, p, "b"), []int{2, 5, 6, 7, 8}; !slices.Equal(got, want) {
		t.Fatalf("b's versions %v, want %v (the newest 4 and the pinned one)", got, want)
	}
	if d, err := e.Runtime(ctx, p, pin, map[string]any{"type": "exec", "argv": []any{"curl"}}); err != nil || d.Deny || !d.Kill {
		t.Fatalf("the pinned version: %+v %v", d, err)
	}
	if _, err := st.Transition(ctx, store.Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Failed,
		Driver: session.Timer, Reason: session.ProvisionTimeout, Version: sess.Version}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Put(ctx, p, "b", runtimeV1, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	if got, want := versionNumbers(t, e, p, "b"), []int{6, 7, 8, 9}; !slices.Equal(got, want) {
		t.Fatalf("b's versions %v after its session ended, want %v", got, want)
	}

	if d := newEngine(t, rdb, Options{}); d.maxPolicies != DefaultMaxPolicies || d.maxVersions != DefaultMaxVersions {
		t.Fatalf("the defaults: %d policies, %d versions", d.maxPolicies, d.maxVersions)
	}
}

// TestPinKeepsAdmittedVersion: a version an admission checked (Pin) survives the trim of a
// Put that comes before the admission's session is written, which would otherwise pin a
// version that no longer exists; once the pin window has passed (and no live session pins
// it), trimming takes it.
func TestPinKeepsAdmittedVersion(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	e := newEngine(t, rdb, Options{MaxVersions: 4})
	const p = "proj_pin"
	put := func(e *Engine) {
		t.Helper()
		if _, err := e.Put(ctx, p, "b", runtimeV1, ModeEnforce); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		put(e)
	}
	if got, want := versionNumbers(t, e, p, "b"), []int{2, 3, 4, 5}; !slices.Equal(got, want) {
		t.Fatalf("b's versions %v, want %v", got, want)
	}
	// The admission checks b@2, the oldest kept; a Put lands before its session is written.
	v, err := e.Pin(ctx, p, "pol_b@2")
	if err != nil || v.ID != "pol_b@2" || v.Version != 2 {
		t.Fatalf("Pin: %+v %v", v, err)
	}
	put(e)
	if got, want := versionNumbers(t, e, p, "b"), []int{2, 3, 4, 5, 6}; !slices.Equal(got, want) {
		t.Fatalf("b's versions %v after a put during an admission that named b@2, want %v", got, want)
	}
	if _, _, err := e.Get(ctx, p, "pol_b@2"); err != nil {
		t.Fatalf("the admitted session's version: %v", err)
	}
	if v, err := e.Pin(ctx, p, "pol_b"); err != nil || v.ID != "pol_b@6" {
		t.Fatalf("Pin of the latest: %+v %v", v, err)
	}
	for _, id := range []string{"pol_b@1", "pol_nope", "pol_nope@3"} {
		if _, err := e.Pin(ctx, p, id); !errors.Is(err, ErrNotFound) {
			t.Errorf("Pin %s: %v, want ErrNotFound", id, err)
		}
	}
	// Past the window, with no session pinning it, b@2 goes with the next put.
	short := newEngine(t, rdb, Options{MaxVersions: 4, PinWindow: time.Millisecond})
	time.Sleep(5 * time.Millisecond)
	put(short)
	if got, want := versionNumbers(t, e, p, "b"), []int{4, 5, 6, 7}; !slices.Equal(got, want) {
		t.Fatalf("b's versions %v past the pin window, want %v", got, want)
	}
}

// TestDeletePolicy: Delete refuses while a live session pins a version (naming it) and while
// an admission that named one may not have written its session yet; else it deletes every
// version, the policy stops applying on this engine and on another told of the change, and
// the name, put again, numbers on.
func TestDeletePolicy(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	e := newEngine(t, rdb, Options{})
	other := newEngine(t, rdb, Options{Refresh: time.Hour})
	const p = "proj_del"
	st := store.New(rdb)
	if _, err := st.EnsureProject(ctx, p, p); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := e.Put(ctx, p, "g", tier4Policy, ModeEnforce); err != nil {
			t.Fatal(err)
		}
	}
	denies := func(e *Engine) bool {
		t.Helper()
		d, err := e.Admit(ctx, admission(p, 4, nil))
		if err != nil {
			t.Fatal(err)
		}
		return !d.Allow
	}
	if !denies(e) || !denies(other) {
		t.Fatal("the policy does not apply before its delete")
	}
	var ce *store.ConflictError

	now := time.Now()
	pin := FormatID("g", 1)
	sess := &session.Session{ID: session.NewID("sess_", now), Tier: 2, State: session.Pending, ProjectID: p, Template: "base",
		Region: "local", CreatedAt: *session.At(now), IdleTimeoutS: 60, MaxLifetimeS: 3600, PolicyID: &pin}
	sess, err := st.Create(ctx, sess, 10)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Delete(ctx, p, "g")
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "1 live session") || !strings.Contains(err.Error(), sess.ID) {
		t.Fatalf("delete of a pinned policy: %v", err)
	}
	if _, err := st.Transition(ctx, store.Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Failed,
		Driver: session.Timer, Reason: session.ProvisionTimeout, Version: sess.Version}); err != nil {
		t.Fatal(err)
	}

	if _, err := e.Pin(ctx, p, "pol_g@2"); err != nil {
		t.Fatal(err)
	}
	if _, err = e.Delete(ctx, p, "g"); !errors.As(err, &ce) || !strings.Contains(err.Error(), "pol_g@2 was named by a session") {
		t.Fatalf("delete during an admission that named it: %v", err)
	}
	if got := versionNumbers(t, e, p, "g"); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("refused deletes left versions %v", got)
	}
	rdb.Del(ctx, namedKey(p)) // the pin window passes

	if n, err := e.Delete(ctx, p, "g"); err != nil || n != 2 {
		t.Fatalf("delete: %d versions, %v", n, err)
	}
	if _, err := e.Versions(ctx, p, "g"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("versions after the delete: %v", err)
	}
	if _, err := e.Delete(ctx, p, "g"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a second delete: %v", err)
	}
	other.Forget(p) // as store.Changes tells every gateway
	if denies(e) || denies(other) {
		t.Fatalf("the deleted policy still applies: here %v, on another engine %v", denies(e), denies(other))
	}
	if v, err := e.Put(ctx, p, "g", tier4Policy, ModeEnforce); err != nil || v.ID != "pol_g@3" {
		t.Fatalf("the name put again: %+v %v, want pol_g@3", v, err)
	}
	if _, err := e.Delete(ctx, p, "Bad-Name"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a bad name: %v", err)
	}
}

// TestRetiredIsBounded: the retired hash keeps at most its most names one by one, and past
// them a floor that every new name numbers on from, so that a project that puts and deletes
// name after name does not grow it by one field a delete forever; a name put again still
// numbers on from its last version, whichever way it was kept.
func TestRetiredIsBounded(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	e := newEngine(t, rdb, Options{})
	e.maxRetired = 3
	const p, names = "proj_retired", 8
	last := map[string]int{}
	for i := range names {
		name := fmt.Sprintf("r%d", i)
		for range 1 + i%3 {
			v, err := e.Put(ctx, p, name, tier4Policy, ModeEnforce)
			if err != nil {
				t.Fatal(err)
			}
			last[name] = v.Version
		}
		if _, err := e.Delete(ctx, p, name); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := rdb.HLen(ctx, retiredKey(p)).Result(); err != nil || n > int64(e.maxRetired)+1 {
		t.Fatalf("after %d deleted names the retired hash has %d fields (%v), want at most %d and the floor", names, n, err, e.maxRetired)
	}
	for name, n := range last {
		v, err := e.Put(ctx, p, name, tier4Policy, ModeEnforce)
		if err != nil {
			t.Fatal(err)
		}
		if v.Version <= n {
			t.Errorf("%s put again is version %d; it had %d before its delete", name, v.Version, n)
		}
	}
	if n, err := rdb.HLen(ctx, retiredKey(p)).Result(); err != nil || n > 1 {
		t.Errorf("with every name put again the retired hash has %d fields (%v), want the floor at most", n, err)
	}
}

// TestPolicyLimitsConcurrent: new policies and new versions put at once, through several
// engines (gateways), never pass the limits together.
func TestPolicyLimitsConcurrent(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	const p, maxPolicies, maxVersions, tries = "proj_race", 3, 4, 12
	engines := make([]*Engine, 3)
	for i := range engines {
		engines[i] = newEngine(t, rdb, Options{MaxPolicies: maxPolicies, MaxVersions: maxVersions})
	}
	var wg sync.WaitGroup
	errs := make([]error, tries)
	for i := range tries {
		wg.Go(func() {
			_, errs[i] = engines[i%len(engines)].Put(ctx, p, fmt.Sprintf("p%d", i), tier4Policy, ModeEnforce)
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		var ce *store.ConflictError
		switch {
		case err == nil:
			ok++
		case !errors.As(err, &ce):
			t.Errorf("a put failed otherwise: %v", err)
		}
	}
	ps, err := engines[0].Policies(ctx, p)
	if err != nil || len(ps) != maxPolicies || ok != maxPolicies {
		t.Fatalf("%d policies stored, %d puts answered OK; want %d (%v)", len(ps), ok, maxPolicies, err)
	}

	name := ps[0].Name
	for i := range tries {
		wg.Go(func() {
			if _, err := engines[i%len(engines)].Put(ctx, p, name, tier4Policy, ModeEnforce); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	n := 1 + tries
	if got, want := versionNumbers(t, engines[0], p, name), []int{n - 3, n - 2, n - 1, n}; !slices.Equal(got, want) {
		t.Fatalf("%s's versions %v, want %v", name, got, want)
	}
}
