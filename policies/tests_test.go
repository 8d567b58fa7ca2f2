package policies

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const guardRego = `package wb.admission

deny contains "tier 4 is for the platform team" if input.request.tier == 4
`

func TestRunTests(t *testing.T) {
	files := map[string]string{
		"guard.rego": guardRego,
		"guard_test.rego": `package wb.admission_test

import data.wb.admission

test_tier_4_denied if {
	count(admission.deny) == 1 with input as {"request": {"tier": 4}}
}

test_tier_2_allowed if {
	print("deny at tier 2:", admission.deny) with input as {"request": {"tier": 2}}
	count(admission.deny) == 1 with input as {"request": {"tier": 2}}
}

test_denied_builtin if {
	http.send({"method": "GET", "url": "http://127.0.0.1:1/"})
}

test_too_big if {
	count(concat("", array.reverse(numbers.range(1, 100000000)))) > 0
}

todo_test_later if { true }
`,
	}
	_, err := RunTests(context.Background(), files, 5*time.Second)
	// http.send is not among the platform's capabilities: the files do not compile.
	if err == nil || !strings.Contains(err.Error(), "http.send") {
		t.Fatalf("RunTests with http.send: %v; want the capability's compile error", err)
	}
	files["guard_test.rego"] = strings.Replace(files["guard_test.rego"], `http.send({"method": "GET", "url": "http://127.0.0.1:1/"})`, `1 == 1`, 1)
	res, err := RunTests(context.Background(), files, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := wantResults(t, res, map[string]string{"test_tier_4_denied": "pass", "test_tier_2_allowed": "fail",
		"test_denied_builtin": "pass", "test_too_big": "error", "todo_test_later": "skip"})
	if r := got["test_tier_2_allowed"]; r.Location != "guard_test.rego:9" || r.Output != "deny at tier 2: set()\n" {
		t.Errorf("the failed test says %+v; want its location and what it printed", r)
	}
	if r := got["test_too_big"]; !strings.Contains(r.Error, "memory budget") || strings.Contains(r.Error, boundedPrefix) {
		t.Errorf("the test past the memory budget says %q; want the budget named, the builtin as written", r.Error)
	}
}

func TestRunTestsRefusals(t *testing.T) {
	ctx := context.Background()
	if _, err := RunTests(ctx, map[string]string{"guard.rego": guardRego}, time.Second); !errors.Is(err, ErrNoTests) {
		t.Errorf("no tests: %v; want ErrNoTests", err)
	}
	// A policy file must compile as an upload would: its package names a decision point.
	_, err := RunTests(ctx, map[string]string{"guard.rego": "package wb.other\n\ntest_x if true\n"}, time.Second)
	var ce *CompileError
	if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), "guard.rego: ") || !strings.Contains(err.Error(), "not a decision point") {
		t.Errorf("a policy of another package: %v; want guard.rego's compile error", err)
	}
	_, err = RunTests(ctx, map[string]string{"guard_test.rego": "package wb.admission_test\n\ntest_x if {\n"}, time.Second)
	if err == nil || !strings.Contains(err.Error(), "guard_test.rego: ") {
		t.Errorf("a test file that does not parse: %v; want its name and error", err)
	}
	// A test that loops runs out of its time.
	res, err := RunTests(ctx, map[string]string{"guard_test.rego": `package wb.admission_test

test_slow if {
	count([x | some x in numbers.range(1, 5000); some y in numbers.range(1, 5000); x == y]) > 0
}
`}, 100*time.Millisecond)
	if err != nil || len(res) != 1 || res[0].Result != "error" {
		t.Errorf("a test past its time: %+v, %v; want an error result", res, err)
	}
}

// TestRunTestsBudgetPerTest: each test has the memory budget one evaluation has on the
// platform, whatever the number of tests beside it: a test that makes more than that in
// built-ins' values fails as the policy would at the platform (a budget shared by all the
// tests let one test make the sum of theirs, and pass).
func TestRunTestsBudgetPerTest(t *testing.T) {
	// Ten ranges of 60,000 numbers, 3.8 MB each (under a value's bound), 38 MB in all: past
	// one evaluation's 32 MiB.
	const big = `count([n | some i in numbers.range(1, 10); n := count(numbers.range(i, i + 60000))]) == 10`
	if _, _, err := EvaluateLocal(context.Background(), "guard.rego",
		"package wb.admission\n\ndeny contains \"x\" if "+big+"\n", map[string]any{}); err == nil || !strings.Contains(err.Error(), "memory budget") {
		t.Fatalf("the platform's evaluation of a 38 MB range: %v; want its memory budget error", err)
	}
	res, err := RunTests(context.Background(), map[string]string{"big_test.rego": "package wb.admission_test\n\ntest_big if " + big +
		"\n\ntest_a if true\n\ntest_b if true\n"}, 2*time.Minute) // a loaded machine under -race took over 10 s
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if strings.HasSuffix(r.Name, ".test_big") && (r.Result != "error" || !strings.Contains(r.Error, "memory budget")) {
			t.Errorf("a test making 38 MB beside two others: %+v; want the error the platform gives", r)
		}
	}
}

// TestRunTestsRefHeadTests: a test rule named by a ref (cases.test_a, as opa test runs it) is
// a test: files whose tests are all so named are not "no test rules".
func TestRunTestsRefHeadTests(t *testing.T) {
	res, err := RunTests(context.Background(), map[string]string{"x_test.rego": "package wb.admission_test\n\ncases.test_a if false\n"}, 10*time.Second)
	if err != nil || len(res) != 1 || res[0].Name != "data.wb.admission_test.cases.test_a" || res[0].Result != "fail" {
		t.Errorf("a failing test cases.test_a: %+v, %v; want its failure", res, err)
	}
}

// TestRunTestsPrintWithinBudget: what a test prints is held in memory as it runs: it is within
// the test's memory budget (print is erased from policies on the platform, so only the tester
// holds it).
func TestRunTestsPrintWithinBudget(t *testing.T) {
	src := "package wb.admission_test\n\nkib := \"" + strings.Repeat("x", 1024) + "\"\n\n" +
		"mib := concat(\"\", [kib | some _ in numbers.range(1, 1024)])\n\n" +
		"test_loud if {\n\tevery i in numbers.range(1, 48) { print(i, mib) }\n}\n"
	res, err := RunTests(context.Background(), map[string]string{"loud_test.rego": src}, time.Minute)
	if err != nil || len(res) != 1 {
		t.Fatalf("%+v, %v", res, err)
	}
	var more int64
	if i := strings.LastIndex(res[0].Output, "… ("); i >= 0 {
		_, _ = fmt.Sscanf(res[0].Output[i:], "… (%d bytes more)", &more)
	}
	if res[0].Result != "error" || !strings.Contains(res[0].Error, "memory budget") {
		t.Errorf("a test that printed 1 MiB 48 times: %s %q, %d bytes of output held; want an error past the budget (%d bytes)",
			res[0].Result, res[0].Error, more, int64(defaultEvalMemory))
	}
	// Each test's output is its own, beside skipped tests; past maxTestOutput it is cut.
	src = "package wb.admission_test\n"
	for i := range 8 {
		src += fmt.Sprintf("\ntest_%d if print(\"I am %d\")\n\ntodo_test_%d if true\n", i, i, i)
	}
	src += "\ntest_long if { every i in numbers.range(1, 100) { print(i, kib) } }\n\nkib := \"" + strings.Repeat("x", 1024) + "\"\n"
	res, err = RunTests(context.Background(), map[string]string{"many_test.rego": src}, time.Minute)
	if err != nil || len(res) != 17 {
		t.Fatalf("%d results, %v; want 17", len(res), err)
	}
	for _, r := range res {
		name := strings.TrimPrefix(r.Name, "data.wb.admission_test.")
		var want string
		switch {
		case strings.HasPrefix(name, "todo_"):
		case name == "test_long":
			if !strings.HasPrefix(r.Output, "1 xxx") || !strings.HasSuffix(r.Output, fmt.Sprintf("… (%d bytes more)", 9*1027+90*1028+1029-maxTestOutput)) {
				t.Errorf("test_long's output, %d bytes, ends %q; want it cut", len(r.Output), r.Output[max(len(r.Output)-40, 0):])
			}
			continue
		default:
			want = "I am " + strings.TrimPrefix(name, "test_") + "\n"
		}
		if r.Output != want {
			t.Errorf("%s printed %q; want %q", name, r.Output, want)
		}
	}
}

// TestRunTestsCompileErrorNamesFile: a test file that does not compile is named in the error
// (the tester compiles them together: its errors gave a line, not which file's).
func TestRunTestsCompileErrorNamesFile(t *testing.T) {
	_, err := RunTests(context.Background(), map[string]string{
		"a_test.rego": "package wb.admission_test\n\ntest_a if true\n",
		"b_test.rego": "package wb.admission_test\n\ntest_b if {\n\tunknown_rule == 1\n}\n",
	}, 10*time.Second)
	if err == nil || !strings.Contains(err.Error(), "b_test.rego") || !strings.Contains(err.Error(), "line 4") {
		t.Errorf("a test file referring to an unknown rule: %v; want the file and line named", err)
	}
}

// TestRunTestsMockBoundedBuiltins: tests mock the bounded builtins with the with keyword, as
// opa test lets them mock any builtin: by a value, by a function of theirs, or by another
// builtin, which stays bounded. The names the tests wrote did not resolve ("with keyword
// target must reference existing input, data, or a function").
func TestRunTestsMockBoundedBuiltins(t *testing.T) {
	files := map[string]string{
		"guard.rego": `package wb.admission

deny contains concat("/", ["tier", format_int(input.request.tier, 10)])

warn contains sprintf("tier %d", [input.request.tier])
`,
		"guard_test.rego": `package wb.admission_test

import data.wb.admission

mock_concat(_, _) := "mocked"

test_value_mock if {
	admission.deny == {"valued"} with concat as "valued" with input as {"request": {"tier": 4}}
}

test_function_mock if {
	admission.deny == {"mocked"} with concat as mock_concat with input as {"request": {"tier": 4}}
}

test_sprintf_mock if {
	admission.warn == {"x"} with sprintf as "x" with input as {"request": {"tier": 4}}
}

test_unmocked if {
	admission.deny == {"tier/4"} with input as {"request": {"tier": 4}}
}

test_still_bounded if {
	count(concat("%*s", ["3", "x"])) > 0 with concat as sprintf
}
`,
	}
	res, err := RunTests(context.Background(), files, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := wantResults(t, res, map[string]string{"test_value_mock": "pass", "test_function_mock": "pass",
		"test_sprintf_mock": "pass", "test_unmocked": "pass", "test_still_bounded": "error"})
	if r := got["test_still_bounded"]; !strings.Contains(r.Error, "sprintf: * widths and precisions are not allowed") || strings.Contains(r.Error, boundedPrefix) {
		t.Errorf("concat mocked by sprintf, with a * width: %q; want bounded sprintf's error", r.Error)
	}
	// A mock cannot bring back a builtin the platform does not have.
	files["guard_test.rego"] += "\ntest_network if {\n\tconcat(\"\", []) with concat as http.send\n}\n"
	if _, err := RunTests(context.Background(), files, time.Minute); err == nil || !strings.Contains(err.Error(), "http.send") ||
		!strings.Contains(err.Error(), "guard_test.rego") {
		t.Errorf("a test mocking concat with http.send: %v; want its compile error", err)
	}
}

// wantResults answers res by test name (its package left out) and checks the result of each
// test want names.
func wantResults(t *testing.T, res []TestResult, want map[string]string) map[string]TestResult {
	t.Helper()
	got := map[string]TestResult{}
	for _, r := range res {
		got[strings.TrimPrefix(r.Name, "data.wb.admission_test.")] = r
	}
	for name, w := range want {
		if got[name].Result != w {
			t.Errorf("%s: %+v; want %s", name, got[name], w)
		}
	}
	return got
}
