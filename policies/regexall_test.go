package policies

import (
	"context"
	"math"
	"regexp"
	"regexp/syntax"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// regexAllCalls are the all-match builtins' calls for a pattern, a text and the other operand
// (regex.replace's value, find_n's n), as wb's implementation (taking every call whose
// pattern has no assertion) and OPA's.
func regexAllCalls(pattern, text, value string, n int) map[string][]*ast.Term {
	p, s := ast.StringTerm(pattern), ast.StringTerm(text)
	return map[string][]*ast.Term{
		ast.RegexSplit.Name:                 {p, s},
		ast.RegexFind.Name:                  {p, s, ast.IntNumberTerm(n)},
		ast.RegexFindAllStringSubmatch.Name: {p, s, ast.IntNumberTerm(n)},
		ast.RegexReplace.Name:               {s, p, ast.StringTerm(value)},
	}
}

// measuredBuiltin is wb's implementation of the all-match builtin name, taking every call it
// can.
func measuredBuiltin(name string) topdown.BuiltinFunc {
	orig := topdown.GetBuiltin(name)
	switch name {
	case ast.RegexSplit.Name:
		return regexSplit(orig, measuredRegexAll)
	case ast.RegexFind.Name:
		return regexFindN(orig, measuredRegexAll)
	case ast.RegexFindAllStringSubmatch.Name:
		return regexFindAllSubmatch(orig, measuredRegexAll)
	}
	return regexReplace(orig, measuredRegexAll)
}

// callBuiltin answers f's answer to ops, or its error.
func callBuiltin(f topdown.BuiltinFunc, bctx topdown.BuiltinContext, ops []*ast.Term) (*ast.Term, error) {
	var out *ast.Term
	err := f(bctx, ops, func(t *ast.Term) error { out = t; return nil })
	return out, err
}

// compareRegexAll calls each all-match builtin on pattern, text, value and n as wb and as OPA
// (without and with a cancellation, which takes another path in OPA's regex.replace), and
// reports any difference; it answers whether wb's searches ran (the pattern has no assertion).
func compareRegexAll(t *testing.T, pattern, text, value string, n int) bool {
	t.Helper()
	measured := false
	for name, ops := range regexAllCalls(pattern, text, value, n) {
		for _, bctx := range []topdown.BuiltinContext{{}, {Cancel: topdown.NewCancel()}} {
			want, werr := callBuiltin(topdown.GetBuiltin(name), bctx, ops)
			got, gerr := callBuiltin(measuredBuiltin(name), bctx, ops)
			if (werr != nil) != (gerr != nil) || werr == nil && !got.Equal(want) {
				t.Errorf("%s(%v) = %v, %v; OPA answers %v, %v", name, ops, got, gerr, want, werr)
			}
		}
	}
	if re, err := syntax.Parse(pattern, syntax.Perl); err == nil && contextFree(re) {
		measured = true
	}
	return measured
}

// TestRegexAllAnswersAsOPA: wb's all-match builtins, running every search on a reader from the
// previous match's end, answer what OPA's do, for patterns that match empty, overlap, or span
// several runes, on texts of several-byte runes and invalid UTF-8 (a reader's invalid byte
// must step as the string search's does).
func TestRegexAllAnswersAsOPA(t *testing.T) {
	patterns := []string{"", "a", "a*", "a+", "a?", "a*?", "ab|a", "a|ab", ".*b|a", "x*", "(a)(b)?", "(a*)+", "(a|)", "(|a)",
		"()", "(?:)", ",", `\s+`, `\s*`, `[^,]*`, `(\w+)=(\w*)`, "(?P<k>\\w+)=(?P<v>\\S*)", "日", "日*", ".", "(?s).", ".*", `\pL+`,
		"(?i)A", "(a|b)*?c", `\x{FFFD}`, `\x{FFFD}+`, "[^a]", "[^a]*", "(?U)a+", "a{2,3}", "[[:alpha:]]*", "(a)|b", "(a)|(b)",
		`(\d+)?x`, "本|日本", "ba*", "ab+", "日本", "abc|abd", "ab(c|)", "aa", "a\\x{FFFD}", `--[a-z-]+=\S+`,
		// assertions: OPA's builtin answers
		"^a", "a$", `\bfoo`, `\B`, "(?m)^", `\Aa`, `a\z`, "^", "$"}
	texts := []string{"", "a", "aaa", "ab", "abab", "baaab", "a,b,,c,", "  x  y ", "日本語", "日a本", "\xff", "a\xffb",
		"\xe6\x97", "\xe6\x97\xa5\xff", "\ufffd", "a\ufffd\xff", "\xff\xfe\xfd", "key=val k2= x=y", "\n\na\n", "aXbXc",
		"aaabaaacx", "12x3x", "foo bar foo", "日本日本", "a\xe6\x97b\xe6\x97\xa5", "aab abc abd aa", "--a=b --c-d=e x --f= --", "日本x日本日"}
	values := []string{"", "x", "$1", "${1}x", "$$", "<$0>", "${k}:${v}", "$2$1"}
	ran := 0
	for k, p := range patterns {
		for i, s := range texts {
			for j := range 3 {
				if compareRegexAll(t, p, s, values[(i+j*3+k)%len(values)], []int{-1, 0, 1, 2, 100}[(i+j+k)%5]) {
					ran++
				}
			}
		}
	}
	if ran == 0 {
		t.Fatal("no call ran wb's searches")
	}
}

// FuzzRegexAllAsOPA: wb's all-match builtins, and its single search, answer what OPA's do for
// any pattern and text.
func FuzzRegexAllAsOPA(f *testing.F) {
	f.Add("a*", "baaab", "x", -1)
	f.Add(`(\w+)=(\w*)`, "k=v x= =y", "$2$1", 2)
	f.Add(`\x{FFFD}|.`, "a\xff\xe6\x97\ufffd", "<$0>", -1)
	f.Add("(|a)+", "aab", "", 3)
	f.Fuzz(func(t *testing.T, pattern, text, value string, n int) {
		if len(pattern) > 64 || len(text) > 512 || len(value) > 64 {
			return
		}
		if _, err := regexp.Compile(pattern); err != nil {
			return
		}
		compareRegexAll(t, pattern, text, value, n%8)
		compareRegexMatch(t, pattern, text)
	})
}

// TestRegexAllRefusesRescans: ".*b|a" over 40 KiB of a's (each search reads to the end of the
// text: about 50 s unbounded) is refused once its searches' work passes the bound, quickly,
// saying why; a pattern with an assertion keeps the worst-case rule.
func TestRegexAllRefusesRescans(t *testing.T) {
	text := strings.Repeat("a", 40<<10)
	for name, ops := range regexAllCalls(`.*b|a`, text, "x", -1) {
		start := time.Now()
		_, err := callBuiltin(regexAllReplacement(name), topdown.BuiltinContext{}, ops)
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "too much work for one call (its searches, as this builtin searches again after each match, would read more than") {
			t.Errorf("%s of .*b|a over 40 KiB of a's: %v, want it refused for its work", name, err)
		}
		// About 0.2 s, 4 s under the race detector on a loaded machine; unbounded, 50 s.
		if took > 20*time.Second {
			t.Errorf("%s: refused after %v", name, took)
		}
		t.Logf("%s refused in %v: %v", name, took, err)
	}
	if err := checkRegex(`.*b|a\B`, text, true, false); err == nil || !strings.Contains(err.Error(), "whatever its matches") {
		t.Errorf(".*b|a\\B over 40 KiB of a's: %v, want the worst-case refusal", err)
	}
}

// TestRegexAllGroupsCounted: regexp's FindAll, which OPA's regex.find_n, regex.split and
// regex.replace (with a cancellation, as every evaluation has) run, tracks every group's
// positions whatever the builtin answers, so that 3,000 optional groups on 60 bytes took
// seconds in one call: they are refused, as for regex.find_all_string_submatch_n.
func TestRegexAllGroupsCounted(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	src := "package wb.admission\n\n" +
		"pattern := concat(\"\", [\"(a?)\" | some _ in numbers.range(1, 3000)])\n\n" +
		"text := concat(\"\", [\"a\" | some _ in numbers.range(1, 60)])\n\n"
	for name, call := range map[string]string{
		"find_n":  "count(regex.find_n(pattern, text, -1))",
		"split":   "count(regex.split(pattern, text))",
		"replace": "count(regex.replace(text, pattern, \"x\"))",
	} {
		project := "proj_regex_groups_" + name
		if _, err := e.Put(ctx, project, "groups", src+"deny contains \"answered\" if "+call+" >= 0\n", ModeEnforce); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		d, err := e.Admit(ctx, admission(project, 2, nil))
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allow || len(d.Reasons) != 1 || !strings.Contains(d.Reasons[0], "3000 groups is too large") {
			t.Errorf("regex.%s of 3,000 groups on 60 bytes: %+v after %v, want it refused for its groups", name, d, took)
		}
		t.Logf("regex.%s refused in %v", name, took)
	}
}

// TestRegexAllSeldomMatches: long texts whose pattern matches seldom, taken before by counting
// their matches first, are taken by the counted searches too (the literal prefix skipped to,
// as regexp does).
func TestRegexAllSeldomMatches(t *testing.T) {
	path := strings.Repeat("/opt/toolchains/some-vendor/release-2026.11/bin:", 427) // 20 KiB
	long := strings.Repeat("python3 -c 'print(6*7)' ", 512<<10/24) + "--token=abc"  // 512 KiB
	for _, c := range []struct {
		name string
		ops  []*ast.Term
		want *ast.Term
	}{
		{ast.RegexSplit.Name, []*ast.Term{ast.StringTerm(":"), ast.StringTerm(path)}, nil},
		{ast.RegexFind.Name, []*ast.Term{ast.StringTerm(`--[a-z-]+=\S+`), ast.StringTerm(long), ast.IntNumberTerm(-1)},
			ast.ArrayTerm(ast.StringTerm("--token=abc"))},
		{ast.RegexFind.Name, []*ast.Term{ast.StringTerm(`\s--[a-z-]+=\S+`), ast.StringTerm(long), ast.IntNumberTerm(-1)},
			ast.ArrayTerm(ast.StringTerm(" --token=abc"))},
	} {
		if a := newRegexAll(newRegexProgram(string(c.ops[0].Value.(ast.String))), string(c.ops[1].Value.(ast.String)), false, func() bool { return false }); a == nil {
			t.Errorf("%s(%.20v…): OPA's builtin runs, want the counted searches", c.name, c.ops[0])
		}
		start := time.Now()
		got, err := callBuiltin(regexAllReplacement(c.name), topdown.BuiltinContext{}, c.ops)
		took := time.Since(start)
		want, werr := callBuiltin(topdown.GetBuiltin(c.name), topdown.BuiltinContext{}, c.ops)
		if err != nil || werr != nil || !got.Equal(want) || c.want != nil && !got.Equal(c.want) {
			t.Errorf("%s(%v, %d bytes) = %.80v, %v; want %.80v, %v", c.name, c.ops[0], len(c.ops[1].Value.(ast.String)), got, err, want, werr)
		}
		t.Logf("%s(%v) on %d bytes: %v", c.name, c.ops[0], len(c.ops[1].Value.(ast.String)), took)
	}
}

// TestRegexAllCountsSearches: a call of many short searches (an empty pattern over 4 MiB of
// a's, two runes read a search) is refused about as soon as one of few long searches (".*b|a"
// over 40 KiB of a's), both spending the work bound: each search costs more than its reads.
func TestRegexAllCountsSearches(t *testing.T) {
	refusedIn := func(pattern, text string) time.Duration {
		t.Helper()
		fastest := time.Duration(math.MaxInt64)
		for range 3 {
			start := time.Now()
			_, err := callBuiltin(regexAllReplacement(ast.RegexReplace.Name), topdown.BuiltinContext{},
				[]*ast.Term{ast.StringTerm(text), ast.StringTerm(pattern), ast.StringTerm("")})
			fastest = min(fastest, time.Since(start))
			if err == nil || !strings.Contains(err.Error(), "too much work for one call") {
				t.Fatalf("regex.replace of %q over %d bytes: %v, want it refused for its work", pattern, len(text), err)
			}
		}
		return fastest
	}
	long := refusedIn(`.*b|a`, strings.Repeat("a", 40<<10))
	short := refusedIn(``, strings.Repeat("a", 4<<20))
	t.Logf(".*b|a over 40 KiB of a's refused in %v, an empty pattern over 4 MiB in %v", long, short)
	// Each about 0.1 s; uncounted, the short searches took 5 times as long.
	if short > 3*long {
		t.Errorf("many short searches refused after %v, few long ones after %v", short, long)
	}
}

// TestRegexAllSubmatchCharged: find_all_string_submatch_n's answer, an array of one term per
// group for each match, is charged to the evaluation's memory budget whole, not for its top
// level: 32 empty groups over 1,600 bytes, whose 1,601 matches the counted searches now take,
// made 2.4 MiB of terms and were charged 100 KiB.
func TestRegexAllSubmatchCharged(t *testing.T) {
	name := ast.RegexFindAllStringSubmatch.Name
	b := newBudget(32 << 20)
	f := boundedImpl(name, 3, replacement(name), boundedBuiltins[name], func(context.Context) *budget { return b })
	pattern := strings.Repeat("()", 32)
	out, err := f(rego.BuiltinContext{Context: context.Background()},
		[]*ast.Term{ast.StringTerm(pattern), ast.StringTerm(strings.Repeat("a", 1600)), ast.IntNumberTerm(-1)})
	if err != nil {
		t.Fatal(err)
	}
	terms := int64(0)
	out.Value.(*ast.Array).Foreach(func(m *ast.Term) { terms += 1 + int64(m.Value.(*ast.Array).Len()) })
	if charged := b.limit - b.left.Load(); charged < terms*termBytes {
		t.Errorf("an answer of %d terms charged %d bytes, want at least %d", terms, charged, terms*termBytes)
	}
}
