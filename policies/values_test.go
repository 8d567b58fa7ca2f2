package policies

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// sharedArrays compares two arrays written with the same variable 16 times over, 2·16⁵ leaves
// each, in a body of their own.
const sharedArrays = `		a0 := [input.project_id, input.project_id]
		a1 := [a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0]
		a2 := [a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1]
		a3 := [a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2]
		b0 := [input.project_id, input.project_id]
		b1 := [b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0]
		b2 := [b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1]
		b3 := [b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2]
		a4 := [a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3]
		a5 := [a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4, a4]
		b4 := [b3, b3, b3, b3, b3, b3, b3, b3, b3, b3, b3, b3, b3, b3, b3, b3]
		b5 := [b4, b4, b4, b4, b4, b4, b4, b4, b4, b4, b4, b4, b4, b4, b4, b4]
		a5 == b5
`

// sharingPolicies build, each in its own way, two equal values that share their parts
// (2*16^5 strings each, written out, out of a few hundred terms) and compare them. Unchecked,
// OPA's unification recursed once per element compared, past Go's stack limit: "fatal error:
// stack overflow" ended the whole process.
var sharingPolicies = map[string]string{
	// rules of comprehensions that repeat the rule before
	"comprehensions": sharingRules(func(prev string) string { return fmt.Sprintf("[%s | some _ in numbers.range(1, 16)]", prev) }),
	// a function answering an array of its argument 16 times
	"function": sharingRules(func(prev string) string { return fmt.Sprintf("f(%s)", prev) }) +
		"\nf(x) := [x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x]\n",
	// a builtin putting one value in an array twice, four times per rule
	"builtin": sharingRules(func(prev string) string {
		return fmt.Sprintf("array.concat(array.concat([%[1]s, %[1]s], [%[1]s, %[1]s]), array.concat([%[1]s, %[1]s], [%[1]s, %[1]s]))", prev)
	}) + "\nf(x) := x\n",
	// arrays written with the same variable 16 times, in one body
	"locals": `package wb.admission

deny contains "equal" if {
	a0 := [input.project_id, input.project_id]
	a1 := [a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0]
	a2 := [a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1]
	a3 := [a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2]
	b0 := [input.project_id, input.project_id]
	b1 := [b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0, b0]
	b2 := [b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1, b1]
	b3 := [b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2, b2]
	x := [[a3 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]
	y := [[b3 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]
	x == y
}
`,
	// arrays written with the same variable 16 times, in an explicit negation's body (a body the
	// checks once missed: its expressions' values went unchecked)
	"not body": `package wb.admission

import future.keywords.not

deny contains "equal" if {
	not {
` + sharedArrays + `	}
}
`,
	// the same, as the left side of an or
	"or body": `package wb.admission

import future.keywords.or

deny contains "equal" if {
	{
` + sharedArrays + `	} or {
		input.project_id == "never"
	}
}
`,
	// two arrays written with 256 shared values each, compared as written
	"written arrays": `package wb.admission

a0 := [input.project_id, input.project_id]
a3 := [[[a0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]
b0 := [input.project_id, input.project_id]
b3 := [[[b0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]

deny contains "equal" if [` + strings.Repeat("a3, ", 255) + `a3] == [` + strings.Repeat("b3, ", 255) + `b3]
`,
	// input replaced by two arrays written with 256 shared values each, compared
	"with": `package wb.admission

a0 := [input.project_id, input.project_id]
a3 := [[[a0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]
b0 := [input.project_id, input.project_id]
b3 := [[[b0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]

same if input.a == input.b

deny contains "equal" if same with input as {"a": [` + strings.Repeat("a3, ", 255) + `a3], "b": [` + strings.Repeat("b3, ", 255) + `b3]}
`,
	// many comparisons in one body, each of two values under the bound
	"many comparisons": `package wb.admission

a0 := [input.project_id, input.project_id]
a3 := [[[a0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]
b0 := [input.project_id, input.project_id]
b3 := [[[b0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]
v := [a3, a3, a3]
w := [b3, b3, b3]

deny contains "equal" if {
` + strings.Repeat("\tv == w\n\tv = w\n", 50) + `}
`,
	// as many, each inside a pattern that binds another variable too
	"patterns": `package wb.admission

a0 := [input.project_id, input.project_id]
a3 := [[[a0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]
b0 := [input.project_id, input.project_id]
b3 := [[[b0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]
v := [a3, a3, a3]
w := [[b3, b3, b3], 1]

deny contains "equal" if {
` + patterns(100) + `}
`,
	// two partial objects of 16*16 shared values each, compared whole
	"partial rules": `package wb.admission

a0 := [input.project_id, input.project_id]
a3 := [[[a0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]
b0 := [input.project_id, input.project_id]
b3 := [[[b0 | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)] | some _ in numbers.range(1, 16)]

o[i] := a3 if some i in numbers.range(1, 256)
p[i] := b3 if some i in numbers.range(1, 256)

deny contains "equal" if o == p
`,
}

// patterns writes n unifications of v, within a pattern, with w.
func patterns(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "\t[v, y%d] = w\n", i)
	}
	return b.String()
}

// sharingRules writes a0, b0 and five levels of rules each made by next from the one before,
// and a deny comparing the last two.
func sharingRules(next func(prev string) string) string {
	var b strings.Builder
	b.WriteString("package wb.admission\n\na0 := [input.project_id, input.project_id]\nb0 := [input.project_id, input.project_id]\n")
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(&b, "a%d := %s\n", i, next(fmt.Sprintf("a%d", i-1)))
		fmt.Fprintf(&b, "b%d := %s\n", i, next(fmt.Sprintf("b%d", i-1)))
	}
	b.WriteString("\ndeny contains \"equal\" if { x := a5; y := b5; x == y }\n")
	return b.String()
}

// TestSharedValuesCannotCrashTheProcess: a policy that compares huge values made of shared
// parts, however it makes them, fails its evaluation (the create is denied, the event
// refused) instead of ending the process; one that compares values within the bound many
// times decides. Each policy is evaluated in a child process, so
// that a crash fails the test rather than the test binary.
func TestSharedValuesCannotCrashTheProcess(t *testing.T) {
	if shape := os.Getenv("WB_SHARING_CHILD"); shape != "" {
		sharingChild(t, shape, os.Getenv("WB_SHARING_POINT"))
		return
	}
	for _, shape := range []string{"comprehensions", "function", "builtin", "locals", "not body", "or body", "written arrays", "with", "many comparisons", "patterns", "partial rules"} {
		points := []string{PointAdmission}
		if shape == "comprehensions" {
			points = append(points, PointRuntime)
		}
		for _, point := range points {
			cmd := exec.Command(os.Args[0], "-test.run=^TestSharedValuesCannotCrashTheProcess$", "-test.v")
			cmd.Env = append(os.Environ(), "WB_SHARING_CHILD="+shape, "WB_SHARING_POINT="+point)
			out, err := cmd.CombinedOutput()
			text := string(out)
			if err != nil || strings.Contains(text, "fatal error") || !strings.Contains(text, "--- PASS") {
				first, _, _ := strings.Cut(text, "\ngoroutine ")
				t.Errorf("%s at %s: the evaluation ended the process (%v):\n%.2000s", shape, point, err, first)
				continue
			}
			for line := range strings.Lines(text) {
				if strings.HasPrefix(line, "DECISION") {
					t.Logf("%s at %s: %.300s", shape, point, line)
				}
			}
		}
	}
}

func sharingChild(t *testing.T, shape, point string) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 30 * time.Second}) // the deadline is not what stops them
	src := sharingPolicies[shape]
	const project = "proj_sharing"
	if point == PointRuntime {
		src = strings.Replace(src, "package wb.admission", "package wb.runtime", 1)
		src = strings.Replace(src, `deny contains "equal"`, `kill contains "equal"`, 1)
		src = strings.ReplaceAll(src, "input.project_id", "input.type")
		v, err := e.Put(ctx, project, "rt", src, ModeEnforce)
		if err != nil {
			t.Fatal(err)
		}
		d, err := e.Runtime(ctx, project, v.ID, map[string]any{"type": "exec", "argv": []any{"/bin/true"}, "session": map[string]any{"id": "ses_1"}})
		fmt.Printf("DECISION %+v %v\n", d, err)
		if err != nil || !d.Deny || !strings.Contains(d.DenyReason, "evaluation failed") {
			t.Errorf("%+v %v, want the event refused for a failed evaluation", d, err)
		}
		return
	}
	if _, err := e.Put(ctx, project, "sharing", src, ModeEnforce); err != nil {
		// The bodies of negations and ors are sized at upload like a rule's own.
		if (shape == "not body" || shape == "or body") && strings.Contains(err.Error(), "builds a value of more than") {
			fmt.Printf("DECISION refused at upload: %v\n", err)
			return
		}
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission(project, 2, nil))
	fmt.Printf("DECISION %+v %v\n", d, err)
	want := "evaluation failed" // values past the bound
	if shape == "many comparisons" || shape == "patterns" {
		want = "pol_sharing@1: equal" // values within it: the policy decides
	}
	if err != nil || d.Allow || len(d.Reasons) != 1 || !strings.Contains(d.Reasons[0], want) {
		t.Errorf("%+v %v, want a deny saying %q", d, err, want)
	}
}

// TestOrdinaryValuesPass: values of ordinary size, shared or not, pass the checks: a
// comprehension of 20,000 numbers, objects built of it, a partial rule compared whole.
func TestOrdinaryValuesPass(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 10 * time.Second}) // about the checks, not time (-race is slow)
	src := `package wb.admission

nums := [n | some n in numbers.range(1, 5000)]
pairs := {"a": nums, "b": nums, "c": [nums, nums]}
tiers[t] := {"tier": t, "ok": t <= 3} if some t in numbers.range(1, 4)

deny contains "odd" if {
	count(pairs.c[1]) != 5000
}

deny contains "tiers" if {
	tiers != {t: {"tier": t, "ok": t <= 3} | some t in numbers.range(1, 4)}
}

warn contains sprintf("tier %d", [input.request.tier]) if {
	x := [input.request.tier, input.request.tier]
	[a, b] := x
	a == b
	pairs.a == pairs.b
	[m, n] := pairs.c
	[m, k] = [pairs.a, 5]
	k == 5
	count(n) == 5000
}

defaults := {"metadata": {"team": "core"}}
`
	if _, err := e.Put(ctx, "proj_ordinary", "ordinary", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission("proj_ordinary", 2, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allow || len(d.Warnings) != 1 || d.Warnings[0] != "pol_ordinary@1: tier 2" || d.Patch == nil {
		t.Errorf("%+v, want allowed with one warning and the defaults", d)
	}
}

// TestUnreadRulesStayUnevaluated: the engine asks a policy only for the rules it reads (deny,
// warn, defaults at admission), so a helper rule holding a huge shared value is neither
// evaluated nor written out as Go values, outside the evaluation's budget and deadline
// (depth 5: 2*16^5 strings; this took ~114 MiB of heap, depth 7 tens of GiB).
func TestUnreadRulesStayUnevaluated(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 250 * time.Millisecond, EvalMemory: 32 << 20})
	var src strings.Builder
	src.WriteString("package wb.admission\n\na0 := [\"0123456789abcdef\", \"0123456789abcdef\"]\n")
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(&src, "a%d := [a%d | some _ in numbers.range(1, 16)]\n", i, i-1)
	}
	src.WriteString("\nwarn contains \"read\" if true\n")
	const project = "proj_unread"
	if _, err := e.Put(ctx, project, "unread", src.String(), ModeEnforce); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Admit(ctx, admission("proj_warmup", 2, nil)); err != nil {
		t.Fatal(err)
	}
	m := startMemPeak()
	start := time.Now()
	d, err := e.Admit(ctx, admission(project, 2, nil))
	took := time.Since(start)
	heap, _ := m.end()
	if err != nil || !d.Allow || len(d.Warnings) != 1 {
		t.Errorf("%+v %v, want allowed with the policy's warning", d, err)
	}
	if took > time.Second || heap > 16<<20 {
		t.Errorf("one admission took %v and grew the heap by %s; want within EvalTimeout and a few MiB", took, bytesText(int64(heap)))
	}
}

// TestNegatedComparisonKeepsItsMeaning: a negated comparison is not rewritten (a rewrite hoisted
// its reference out of the negation: "not input.missing == x" held, and its deny fired, only
// before).
func TestNegatedComparisonKeepsItsMeaning(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	const project = "proj_negated"
	src := `package wb.admission

deny contains "no owner" if {
	x := input.project_id
	not input.missing.owner == x
}
`
	if _, err := e.Put(ctx, project, "negated", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission(project, 2, nil))
	if err != nil || d.Allow || len(d.Reasons) != 1 || !strings.Contains(d.Reasons[0], "no owner") {
		t.Errorf("%+v %v, want the deny \"no owner\" (input.missing is undefined, so the negation holds)", d, err)
	}
}

// TestWithCannotReplaceValueCheck: the value check is a builtin to the compiler, and the with
// keyword replaced it like any other (`with wb.bounded.value as true`) for every rule the
// expression evaluated: their values were made past maxValueBytes unchecked. It is refused.
func TestWithCannotReplaceValueCheck(t *testing.T) {
	ctx := context.Background()
	src := `package wb.admission

a := [1 | some _ in numbers.range(1, 64)]

b := [a | some _ in numbers.range(1, 64)]

c := [b | some _ in numbers.range(1, 64)]

deny contains "made" if {
	count(c) == 64%s
}
`
	if _, _, err := EvaluateLocal(ctx, "big.rego", fmt.Sprintf(src, ""), map[string]any{}); err == nil || !strings.Contains(err.Error(), "more than 4.0 MiB") {
		t.Fatalf("a value of 64³ elements: %v; want the value check's error", err)
	}
	for _, with := range []string{" with wb.bounded.value as true", " with wb.bounded.value as one_two", " with data.wb.admission.c as [] with wb.bounded.value as true"} {
		_, doc, err := EvaluateLocal(ctx, "big.rego", fmt.Sprintf(src, with)+"\none_two(_, _) := true\n", map[string]any{})
		var ce *CompileError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "value check") {
			t.Errorf("%s: %v, %v; want a compile error naming the value check", with, doc, err)
		}
	}
	_, err := RunTests(ctx, map[string]string{"big_test.rego": "package wb.admission_test\n\ntest_x if {\n\ttrue with wb.bounded.value as true\n}\n"}, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "value check") {
		t.Errorf("a test replacing the value check: %v; want its compile error", err)
	}
}
