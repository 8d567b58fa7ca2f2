package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"wb/client"
	"wb/session"
)

// env is a fake environment for an app.
type env map[string]string

func (e env) get(k string) string { return e[k] }

// newTestApp is an app on buffers with env as its environment.
func newTestApp(e env, in string) (*app, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	return &app{Streams: Streams{In: strings.NewReader(in), Out: &out, Err: &errb}, getenv: e.get, now: time.Now}, &out, &errb
}

func TestTableRendering(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	user := "alice"
	reason := session.Reason("idle_timeout")
	ss := []client.Session{
		{ID: "sess_a", Tier: 2, State: "running", Template: "tpl_base@sha256:abc", EndUserID: &user, CreatedAt: session.Time{Time: now.Add(-90 * time.Second)}},
		{ID: "sess_bbbbbbbb", Tier: 3, State: "stopped", Template: "tpl_dev_polyglot@sha256:def", StateReason: &reason, CreatedAt: session.Time{Time: now.Add(-50 * time.Hour)}},
	}
	var b bytes.Buffer
	if err := sessionsTable(now, ss...).render(&b); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"ID             TIER  STATE    TEMPLATE          END USER  AGE  REASON\n" +
		"sess_a         2     running  tpl_base          alice     1m   -\n" +
		"sess_bbbbbbbb  3     stopped  tpl_dev_polyglot  -         2d   idle_timeout\n"
	if b.String() != want {
		t.Errorf("sessions table:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	u := &client.Usage{GroupBy: "end_user", Data: []client.UsageLine{{EndUserID: "bob", UsageTotals: client.UsageTotals{SessionS: 60, CostMicroUSD: 1234567, EgressBytes: 3 << 20}}},
		Totals: client.UsageTotals{SessionS: 60, CostMicroUSD: 1234567, EgressBytes: 3 << 20}}
	if err := usageTable(u).render(&b); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"END USER", "bob", "$1.234567", "3.0MiB", "TOTAL"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("usage table lacks %q:\n%s", w, b.String())
		}
	}

	// A tab or newline in a value must not break the columns.
	b.Reset()
	_ = table{header: []string{"A", "B"}, rows: [][]string{{"x\ty", "1\n2"}}}.render(&b)
	if got := b.String(); strings.Count(got, "\n") != 2 || !strings.Contains(got, "x y") {
		t.Errorf("value with tab/newline: %q", got)
	}

	for _, c := range []struct {
		micro int64
		want  string
	}{{0, "$0.000000"}, {5, "$0.000005"}, {12_500_000, "$12.500000"}, {-1, "-$0.000001"}} {
		if got := usd(c.micro); got != c.want {
			t.Errorf("usd(%d) = %s, want %s", c.micro, got, c.want)
		}
	}
	for _, c := range []struct {
		n    int64
		want string
	}{{0, "0B"}, {1023, "1023B"}, {1536, "1.5KiB"}, {5 << 30, "5.0GiB"}} {
		if got := bytesText(c.n); got != c.want {
			t.Errorf("bytesText(%d) = %s, want %s", c.n, got, c.want)
		}
	}
	if got := age(now, now.Add(-3*time.Hour)); got != "3h" {
		t.Errorf("age 3h = %s", got)
	}
}

// TestConfigPrecedence: for each of URL and key, the flag wins, then the profile --profile
// names, then WB_URL/WB_API_KEY, then the profile WB_PROFILE names or "default"; what is
// missing is named.
func TestConfigPrecedence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(path, []byte(`# wb profiles
[default]
url = http://default.test
api_key = key_default

[staging]
url = "http://staging.test"
api_key = key_staging

[urlonly]
url = http://urlonly.test
`), 0o600); err != nil {
		t.Fatal(err)
	}
	envBoth := env{"WB_URL": "http://env.test", "WB_API_KEY": "key_env"}
	for _, c := range []struct {
		name     string
		in       configInputs
		env      env
		url, key string
		err      string
	}{
		{name: "default profile alone", env: env{}, url: "http://default.test", key: "key_default"},
		{name: "env over default profile", env: envBoth, url: "http://env.test", key: "key_env"},
		{name: "WB_PROFILE under env", env: env{"WB_PROFILE": "staging", "WB_API_KEY": "key_env"}, url: "http://staging.test", key: "key_env"},
		{name: "--profile over env", in: configInputs{profile: "staging", profileSet: true}, env: envBoth, url: "http://staging.test", key: "key_staging"},
		{name: "flags over --profile", in: configInputs{apiKey: "key_flag", keySet: true, profile: "staging", profileSet: true}, env: envBoth, url: "http://staging.test", key: "key_flag"},
		{name: "each value on its own", in: configInputs{profile: "urlonly", profileSet: true}, env: env{"WB_API_KEY": "key_env"}, url: "http://urlonly.test", key: "key_env"},
		{name: "unknown --profile", in: configInputs{profile: "prod", profileSet: true}, env: envBoth, err: `no [prod] section`},
		{name: "unknown WB_PROFILE", env: env{"WB_PROFILE": "prod"}, err: `no [prod] section`},
		{name: "an empty flag is given, not absent", in: configInputs{urlSet: true}, env: envBoth, err: "missing the API URL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := resolveConfig(c.in, c.env.get, path)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || cfg.url != c.url || cfg.apiKey != c.key {
				t.Fatalf("got %+v, %v; want url %s key %s", cfg, err, c.url, c.key)
			}
		})
	}
	// Nothing anywhere: both are named, with the file.
	_, err := resolveConfig(configInputs{}, env{}.get, filepath.Join(t.TempDir(), "absent"))
	if err == nil || !strings.Contains(err.Error(), "API URL (--url, WB_URL") || !strings.Contains(err.Error(), "API key (--api-key, WB_API_KEY") || !strings.Contains(err.Error(), "absent") {
		t.Fatalf("nothing configured: %v", err)
	}
	// A malformed file says where.
	bad := filepath.Join(t.TempDir(), "bad")
	_ = os.WriteFile(bad, []byte("[default]\ntoken = x\n"), 0o600)
	if _, err := resolveConfig(configInputs{}, env{}.get, bad); err == nil || !strings.Contains(err.Error(), ":2: unknown key \"token\"") {
		t.Fatalf("malformed file: %v", err)
	}
}

// TestConfigPath: the profile file is found where each system keeps a user's files; Windows
// sets no HOME, only USERPROFILE.
func TestConfigPath(t *testing.T) {
	for _, c := range []struct {
		env  env
		want string
	}{
		{env{"WB_CONFIG": "/etc/wb.conf", "HOME": "/home/u"}, "/etc/wb.conf"},
		{env{"XDG_CONFIG_HOME": "/x", "HOME": "/home/u"}, filepath.Join("/x", "wb", "config")},
		{env{"HOME": "/home/u", "USERPROFILE": `C:\Users\u`}, filepath.Join("/home/u", ".config", "wb", "config")},
		{env{"USERPROFILE": `C:\Users\u`}, filepath.Join(`C:\Users\u`, ".config", "wb", "config")},
		{env{}, ""},
	} {
		a, _, _ := newTestApp(c.env, "")
		if got := a.configPath(); got != c.want {
			t.Errorf("environment %v: profile file %q, want %q", c.env, got, c.want)
		}
	}
}

// TestFlagsReachConfig: --url, --api-key (and the old --key), --profile and WB_CONFIG reach
// the configuration of a command.
func TestFlagsReachConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config")
	_ = os.WriteFile(path, []byte("[p]\nurl = http://127.0.0.1:1\napi_key = key_p\n"), 0o600)
	a, _, _ := newTestApp(env{"WB_CONFIG": path}, "")
	a.root = a.newRoot()
	if err := a.root.ParseFlags([]string{"--profile", "p", "--key", "key_flag"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := resolveConfig(configInputs{url: a.url, apiKey: a.apiKey, profile: a.profile,
		urlSet: a.flagSet("url"), keySet: a.flagSet("api-key"), profileSet: a.flagSet("profile")}, a.getenv, a.configPath())
	if err != nil || cfg.url != "http://127.0.0.1:1" || cfg.apiKey != "key_flag" {
		t.Fatalf("--profile p --key key_flag: %+v %v", cfg, err)
	}
	// With nothing configured, a command fails before any call, naming what is missing.
	a, _, _ = newTestApp(env{"HOME": t.TempDir()}, "")
	err = a.run(context.Background(), []string{"sessions", "ls"})
	if err == nil || !strings.Contains(err.Error(), "missing the API URL") {
		t.Fatalf("unconfigured sessions ls: %v", err)
	}
}

// TestHelpHasExamples: every command that does something documents itself, with examples
// on each group and on the commands whose use is not obvious.
func TestHelpHasExamples(t *testing.T) {
	a, _, _ := newTestApp(env{}, "")
	root := a.newRoot()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Short == "" {
				t.Errorf("%s has no short help", sub.CommandPath())
			}
			if sub.HasSubCommands() && sub.Example == "" {
				t.Errorf("%s has no examples", sub.CommandPath())
			}
			walk(sub)
		}
	}
	walk(root)
	for _, args := range [][]string{{"sessions", "exec", "--help"}, {"pty", "--help"}, {"runs", "create", "--help"}, {"webhooks", "--help"}, {"desktops", "--help"}} {
		a, out, _ := newTestApp(env{}, "")
		if err := a.run(context.Background(), args); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.Contains(out.String(), "Examples:") || !strings.Contains(out.String(), "wb ") {
			t.Errorf("%v: no examples:\n%s", args, out.String())
		}
	}
}

// TestCompletionScripts: wb completion prints each shell's script for the wb command.
func TestCompletionScripts(t *testing.T) {
	for shell, want := range map[string]string{"bash": "__start_wb", "zsh": "#compdef wb", "fish": "complete -c wb"} {
		a, out, _ := newTestApp(env{}, "")
		if err := a.run(context.Background(), []string{"completion", shell}); err != nil {
			t.Fatalf("%s: %v", shell, err)
		}
		if !strings.Contains(out.String(), want) {
			t.Errorf("completion %s lacks %q:\n%.300s", shell, want, out.String())
		}
	}
	// The scripts call back `wb __complete …`: it answers the subcommands and flag values.
	a, out, _ := newTestApp(env{}, "")
	if err := a.run(context.Background(), []string{cobra.ShellCompRequestCmd, "sessions", ""}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"create", "exec", "pty", "snapshot"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("__complete sessions lacks %q:\n%s", w, out.String())
		}
	}
	a, out, _ = newTestApp(env{}, "")
	_ = a.run(context.Background(), []string{cobra.ShellCompRequestCmd, "sessions", "ls", "-o", ""})
	if !strings.Contains(out.String(), "json") || !strings.Contains(out.String(), "table") {
		t.Errorf("__complete -o lacks table and json:\n%s", out.String())
	}
	for _, name := range []string{"sessions", "pty", "completion", cobra.ShellCompRequestCmd} {
		if !Handles(name) {
			t.Errorf("Handles(%q) is false", name)
		}
	}
	if Handles("serve") {
		t.Error("Handles(serve): the operator's commands stay in cmd/wb")
	}
}

// TestArgumentErrors: wrong arguments are refused before any call, saying what is wanted.
func TestArgumentErrors(t *testing.T) {
	e := env{"WB_URL": "http://127.0.0.1:1", "WB_API_KEY": "k"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sessions", "exec", "sess_1"}, "then -- and the command"},
		{[]string{"sessions", "exec", "sess_1", "ls"}, "then -- and the command"},
		{[]string{"sessions", "get"}, "needs a SESSION_ID"},
		{[]string{"sessions", "ls", "-o", "yaml"}, `--output "yaml": want table or json`},
		{[]string{"sessions", "ls", "--frobnicate"}, `unknown flag: --frobnicate (run "wb sessions ls --help"`},
		{[]string{"runs", "create"}, "give --session ID -- COMMAND, or --runtime"},
		{[]string{"webhooks", "create", "https://example.com/h"}, "needs --events"},
		{[]string{"policies", "test", "x.rego", "y.rego", "--input", "in.json"}, "--input evaluates one FILE.rego (got 2 files"},
		{[]string{"usage", "--from", "yesterday"}, `--from "yesterday": want RFC 3339`},
	} {
		a, _, _ := newTestApp(e, "")
		err := a.run(context.Background(), c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestAPIErrorText: an API error is shown as its message with its param, type and status.
func TestAPIErrorText(t *testing.T) {
	err := apiError{&client.Error{Status: 400, Type: "invalid_request", Code: "invalid_value", Param: "tier", Message: "tier must be 1–4"}}
	if got := err.Error(); got != "tier must be 1–4 (param tier) [400 invalid_request/invalid_value]" {
		t.Errorf("got %q", got)
	}
	var ce *client.Error
	if !errors.As(err, &ce) {
		t.Error("apiError does not unwrap to *client.Error")
	}
	if exitCode(0) != nil {
		t.Error("exit 0 is an error")
	}
	var ee *ExitError
	if !errors.As(exitCode(300), &ee) || ee.Code != 1 || !errors.As(exitCode(7), &ee) || ee.Code != 7 {
		t.Error("exit codes not kept or clamped")
	}
	if err := execEnd(0, true, 2000); !errors.As(err, &ee) || ee.Code != 124 || !strings.Contains(err.Error(), "timed out after 2s") {
		t.Errorf("timeout: %v", err)
	}
}

// TestPoliciesTestLocal: wb policies test compiles and evaluates a policy on an input
// without any API, and refuses one that would not compile on upload.
func TestPoliciesTestLocal(t *testing.T) {
	dir := t.TempDir()
	rego := filepath.Join(dir, "guard.rego")
	_ = os.WriteFile(rego, []byte("package wb.admission\n\ndeny contains \"tier 4 is for admins\" if input.request.tier == 4\n"), 0o644)
	in := filepath.Join(dir, "in.json")
	_ = os.WriteFile(in, []byte(`{"request": {"tier": 4}}`), 0o644)
	a, out, _ := newTestApp(env{}, "")
	if err := a.run(context.Background(), []string{"policies", "test", rego, "--input", in}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Point  string `json:"point"`
		Result struct {
			Deny []string `json:"deny"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if got.Point != "admission" || len(got.Result.Deny) != 1 || got.Result.Deny[0] != "tier 4 is for admins" {
		t.Fatalf("decision %+v", got)
	}
	_ = os.WriteFile(rego, []byte("package wb.admission\n\ndeny contains x if { x := http.send({\"url\": \"http://127.0.0.1:1\"}) }\n"), 0o644)
	a, _, _ = newTestApp(env{}, "")
	if err := a.run(context.Background(), []string{"policies", "test", rego, "--input", in}); err == nil || !strings.Contains(err.Error(), "http.send") {
		t.Fatalf("a policy calling http.send: %v", err)
	}
}

// TestPoliciesTestRunsRegoTests: wb policies test without --input runs the files' test rules,
// prints each result and what a failed test printed, and exits 1 when one fails.
func TestPoliciesTestRunsRegoTests(t *testing.T) {
	dir := t.TempDir()
	rego, tests := filepath.Join(dir, "guard.rego"), filepath.Join(dir, "guard_test.rego")
	_ = os.WriteFile(rego, []byte("package wb.admission\n\ndeny contains \"tier 4 is for admins\" if input.request.tier == 4\n"), 0o644)
	_ = os.WriteFile(tests, []byte(`package wb.admission_test

import data.wb.admission

test_tier_4_denied if count(admission.deny) == 1 with input as {"request": {"tier": 4}}

test_tier_2_denied if {
	print("deny at tier 2:", admission.deny) with input as {"request": {"tier": 2}}
	count(admission.deny) == 1 with input as {"request": {"tier": 2}}
}
`), 0o644)
	a, out, _ := newTestApp(env{}, "")
	err := a.run(context.Background(), []string{"policies", "test", rego, tests})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 1 {
		t.Fatalf("a failing Rego test: %v; want exit 1\n%s", err, out)
	}
	for _, want := range []string{"PASS    data.wb.admission_test.test_tier_4_denied  guard_test.rego:5",
		"FAIL    data.wb.admission_test.test_tier_2_denied  guard_test.rego:7",
		"data.wb.admission_test.test_tier_2_denied printed:\ndeny at tier 2: set()\n", "1 of 2 tests passed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	_ = os.WriteFile(tests, []byte("package wb.admission_test\n\nimport data.wb.admission\n\ntest_tier_4_denied if count(admission.deny) == 1 with input as {\"request\": {\"tier\": 4}}\n"), 0o644)
	a, out, _ = newTestApp(env{}, "")
	if err := a.run(context.Background(), []string{"policies", "test", rego, tests, "-o", "json"}); err != nil {
		t.Fatalf("passing Rego tests: %v\n%s", err, out)
	}
	var res []struct{ Name, Result string }
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || len(res) != 1 || res[0].Result != "pass" {
		t.Fatalf("-o json: %+v, %v: %s", res, err, out)
	}
	a, _, _ = newTestApp(env{}, "")
	if err := a.run(context.Background(), []string{"policies", "test", rego}); err == nil || !strings.Contains(err.Error(), "no test rules") || !strings.Contains(err.Error(), "--input") {
		t.Fatalf("a policy without tests: %v; want it to say so and name --input", err)
	}
}

// TestProgressOnlyOnTerminal: progress lines are written only when stderr is a terminal.
func TestProgressOnlyOnTerminal(t *testing.T) {
	for _, on := range []bool{true, false} {
		a, _, errb := newTestApp(env{}, "")
		a.progress = on
		p := a.newProgress()
		p.show("sess_1: pending")
		p.show("sess_1: running")
		p.done()
		got := errb.String()
		if on && (!strings.Contains(got, "\r\x1b[Ksess_1: running (") || !strings.HasSuffix(got, "\n")) {
			t.Errorf("on a terminal: %q", got)
		}
		if !on && got != "" {
			t.Errorf("not a terminal, yet: %q", got)
		}
	}
}

// TestPoliciesTestInLineOrder: wb policies test lists the tests in their files' order, line
// by line (line 9 before line 11).
func TestPoliciesTestInLineOrder(t *testing.T) {
	dir := t.TempDir()
	tests := filepath.Join(dir, "guard_test.rego")
	src := "package wb.admission_test\n"
	for i := range 6 {
		src += fmt.Sprintf("\ntest_%d if true\n", i)
	}
	_ = os.WriteFile(tests, []byte(src), 0o644)
	a, out, _ := newTestApp(env{}, "")
	if err := a.run(context.Background(), []string{"policies", "test", tests}); err != nil {
		t.Fatalf("passing Rego tests: %v\n%s", err, out)
	}
	last := -1
	for i := range 6 {
		at := strings.Index(out.String(), fmt.Sprintf("test_%d ", i))
		if at < last {
			t.Fatalf("test_%d (line %d) is listed before the test of the line above it:\n%s", i, 3+2*i, out)
		}
		last = at
	}
}

// TestPoliciesTestSkippedNotPassed: a skipped test (todo_test_…) is not counted as passed.
func TestPoliciesTestSkippedNotPassed(t *testing.T) {
	tests := filepath.Join(t.TempDir(), "guard_test.rego")
	_ = os.WriteFile(tests, []byte("package wb.admission_test\n\ntest_a if true\n\ntodo_test_b if true\n"), 0o644)
	a, out, _ := newTestApp(env{}, "")
	if err := a.run(context.Background(), []string{"policies", "test", tests}); err != nil {
		t.Fatalf("a passing and a skipped Rego test: %v\n%s", err, out)
	}
	if !strings.Contains(out.String(), "1 of 2 tests passed, 1 skipped\n") {
		t.Errorf("the summary of a passing and a skipped test; want \"1 of 2 tests passed, 1 skipped\":\n%s", out)
	}
}
