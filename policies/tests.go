package policies

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/print"
)

// TestResult is one Rego test's outcome (RunTests).
type TestResult struct {
	// Name is the test rule's full name: "data.wb.admission.test_denies_tier_4".
	Name string `json:"name"`
	// Location is where the rule is: "guard_test.rego:12". RunTests answers the results in
	// this order, line by line.
	Location string `json:"location"`
	// Result is "pass", "fail" (its body was not true), "error" (its evaluation failed:
	// Error says why) or "skip" (a rule named todo_test_…).
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
	// Output is what the test printed (print(…)), at most maxTestOutput bytes of it.
	Output string `json:"output,omitempty"`
	// DurationMS is how long the test took, in milliseconds.
	DurationMS float64 `json:"duration_ms"`
}

// maxTestOutput bounds what a TestResult keeps of its test's print output.
const maxTestOutput = 4 << 10

// ErrNoTests is RunTests's error for files that hold no test rule.
var ErrNoTests = errors.New("no test rules (rules named test_…, as opa test runs them)")

// RunTests runs the test rules (test_…) of files (file name → Rego v1 source) as `opa test`
// does, but as the platform evaluates policies: the same Rego version, capabilities and
// bounded built-ins, and each test within perTest. Each file not named *_test.rego is a
// policy and must compile as an upload would (a package of a decision point, the size
// checks); test files may be of any package (wb.admission or wb.admission_test, as OPA's
// convention has it). Each test may make defaultEvalMemory in built-ins' values, as one
// evaluation on the platform may.
func RunTests(ctx context.Context, files map[string]string, perTest time.Duration) ([]TestResult, error) {
	caps := capabilities()
	mods := map[string]*ast.Module{}
	tests := 0
	for _, name := range slices.Sorted(maps.Keys(files)) {
		src := files[name]
		if !strings.HasSuffix(name, "_test.rego") {
			if _, err := compile(ctx, caps, name, src); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		}
		m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{RegoVersion: ast.RegoV1, Capabilities: caps})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, compileError(err))
		}
		for _, r := range m.Rules {
			if isTest(r) {
				tests++
			}
		}
		mods[name] = m
	}
	if tests == 0 {
		return nil, ErrNoTests
	}
	// Each test has the budget of one evaluation on the platform, its own: the tester makes a
	// rego instance for each test and registers the custom built-ins on it, so a budget made
	// there is the test's. (One in ctx would be shared by the tests: a test could make what
	// all of them may, and pass where the platform fails the policy.) What a test prints is
	// charged to it too, in place of the tester's print hook, which held all of it: the
	// hooks are queued in the order the tests run, one at a time, and so their results come.
	var mu sync.Mutex
	var hooks []*testPrints
	bounded := []*tester.Builtin{{Func: func(r *rego.Rego) {
		b := newBudget(defaultEvalMemory)
		for _, f := range boundedFunctionsCharging(func(context.Context) *budget { return b }) {
			f(r)
		}
		h := &testPrints{b: b}
		rego.PrintHook(h)(r)
		mu.Lock()
		hooks = append(hooks, h)
		mu.Unlock()
	}}}
	ch, err := tester.NewRunner().SetCompiler(newCompiler(caps).WithEnablePrintStatements(true)).AddCustomBuiltins(bounded).
		SetParallel(1).SetModules(mods).SetTimeout(perTest).RunTests(ctx, nil)
	if err != nil {
		return nil, testsCompileError(err)
	}
	type placed struct {
		TestResult
		file string
		row  int
	}
	var all []placed
	for r := range ch {
		t := TestResult{Name: r.Package + "." + r.Name, Result: "pass", DurationMS: float64(r.Duration.Microseconds()) / 1000}
		if !r.Skip { // a skipped test has no rego instance, so no hook
			mu.Lock()
			if len(hooks) > 0 {
				t.Output = hooks[0].output()
				hooks = hooks[1:]
			}
			mu.Unlock()
		}
		if r.Location != nil {
			t.Location = fmt.Sprintf("%s:%d", r.Location.File, r.Location.Row)
		}
		switch {
		case r.Error != nil:
			t.Result, t.Error = "error", unbounded(r.Error.Error())
		case r.Fail:
			t.Result = "fail"
		case r.Skip:
			t.Result = "skip"
		}
		p := placed{TestResult: t}
		if r.Location != nil {
			p.file, p.row = r.Location.File, r.Location.Row
		}
		all = append(all, p)
	}
	// The tester answers in any order: the results are in the files' order, line by line
	// ("guard_test.rego:9" before "guard_test.rego:11").
	slices.SortFunc(all, func(x, y placed) int {
		return cmp.Or(strings.Compare(x.file, y.file), cmp.Compare(x.row, y.row), strings.Compare(x.Name, y.Name))
	})
	out := make([]TestResult, len(all))
	for i, p := range all {
		out[i] = p.TestResult
	}
	return out, nil
}

// isTest reports whether the tester runs rule r as a test: a name in its head's ground ref
// begins with test_ or todo_test_ (test_a, and cases.test_a too).
func isTest(r *ast.Rule) bool {
	for _, t := range r.Head.Ref().GroundPrefix() {
		var n string
		switch v := t.Value.(type) {
		case ast.Var:
			n = string(v)
		case ast.String:
			n = string(v)
		}
		if strings.HasPrefix(n, tester.TestPrefix) || strings.HasPrefix(n, tester.SkipTestPrefix) {
			return true
		}
	}
	return false
}

// testPrints is one test's print hook: it charges what the test prints to the test's budget
// and keeps the first maxTestOutput bytes of it.
type testPrints struct {
	b     *budget
	mu    sync.Mutex
	head  []byte
	total int64
}

func (p *testPrints) Print(_ print.Context, msg string) error {
	n := int64(len(msg)) + 1 // and its newline
	if n > p.b.left.Load() {
		// As topdown's own Halt (not rego's HaltError, which only a function's answer is
		// turned into): an error of the print hook otherwise leaves print undefined, and
		// the test failed, not errs.
		return topdown.Halt{Err: p.b.overrunError("print", n)}
	}
	p.b.left.Add(-n)
	p.mu.Lock()
	defer p.mu.Unlock()
	if room := maxTestOutput + 1 - len(p.head); room > 0 { // one byte over: it was cut
		p.head = append(p.head, (msg + "\n")[:min(int64(room), n)]...)
	}
	p.total += n
	return nil
}

// output is what the test printed, cut at maxTestOutput bytes.
func (p *testPrints) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.total <= maxTestOutput {
		return string(p.head)
	}
	return strings.ToValidUTF8(string(p.head[:maxTestOutput]), "") + fmt.Sprintf("… (%d bytes more)", p.total-maxTestOutput)
}

// testsCompileError is the tester's compile error, each error with its file: the tester
// compiles the files together.
func testsCompileError(err error) error {
	var errs ast.Errors
	if !errors.As(err, &errs) {
		return errors.New(unbounded(compileError(err).Error()))
	}
	var b strings.Builder
	b.WriteString("tests do not compile: ")
	for i, e := range errs {
		if i > 0 {
			b.WriteString("; ")
		}
		if e.Location != nil && e.Location.File != "" {
			fmt.Fprintf(&b, "%s, line %d, column %d: ", e.Location.File, e.Location.Row, e.Location.Col)
		}
		b.WriteString(sourceError(e).Message)
	}
	return errors.New(b.String())
}
