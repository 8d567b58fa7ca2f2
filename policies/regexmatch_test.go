package policies

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// regexMatchNames are the builtins that make one search.
var regexMatchNames = []string{ast.RegexMatch.Name, ast.RegexMatchDeprecated.Name}

// compareRegexMatch calls regex.match and re_match on pattern and text as wb (its search
// counted whatever the pattern's worst case) and as OPA, and reports any difference.
func compareRegexMatch(t *testing.T, pattern, text string) {
	t.Helper()
	ops := []*ast.Term{ast.StringTerm(pattern), ast.StringTerm(text)}
	for _, name := range regexMatchNames {
		want, werr := callBuiltin(topdown.GetBuiltin(name), topdown.BuiltinContext{}, ops)
		got, gerr := callBuiltin(regexMatch(topdown.GetBuiltin(name), measuredRegexOne), topdown.BuiltinContext{}, ops)
		if (werr != nil) != (gerr != nil) || werr == nil && !got.Equal(want) {
			t.Errorf("%s(%q, %q) = %v, %v; OPA answers %v, %v", name, pattern, text, got, gerr, want, werr)
		}
	}
}

// compareTemplateMatch calls regex.template_match as wb (counted) and as OPA.
func compareTemplateMatch(t *testing.T, tpl, text, start, end string) {
	t.Helper()
	ops := []*ast.Term{ast.StringTerm(tpl), ast.StringTerm(text), ast.StringTerm(start), ast.StringTerm(end)}
	name := ast.RegexTemplateMatch.Name
	want, werr := callBuiltin(topdown.GetBuiltin(name), topdown.BuiltinContext{}, ops)
	got, gerr := callBuiltin(regexTemplateMatch(topdown.GetBuiltin(name), measuredRegexOne), topdown.BuiltinContext{}, ops)
	if (werr != nil) != (gerr != nil) || werr == nil && !got.Equal(want) {
		t.Errorf("%s(%q, %q, %q, %q) = %v, %v; OPA answers %v, %v", name, tpl, text, start, end, got, gerr, want, werr)
	}
}

// TestRegexMatchAnswersAsOPA: wb's single search, run on a reader from the text's start (or
// from its literal prefix's first occurrence, for a pattern without assertions), answers what
// OPA's regex.match does: assertions at the text's ends and at word boundaries, several-byte
// runes and invalid UTF-8, empty matches, and patterns that do not compile.
func TestRegexMatchAnswersAsOPA(t *testing.T) {
	patterns := []string{"", "a", "a*", "a+", "ab|a", ".*b|a", "(a)(b)?", "日", ".", "(?s).", `\pL+`, "(?i)A", `\x{FFFD}`,
		"[^a]", "b", "ba*", "日本", "abc|abd", "--[a-z-]+=\\S+", "x", "xyz", "aXb",
		"^a", "a$", "^$", "^", "$", `\bfoo`, `foo\b`, `\B`, `\Ba`, "(?m)^a$", "(?m)^b", `\Aa`, `a\z`, `^[a-z]+$`, `^\s*$`,
		`(?m)^\s*x`, `\bb`, "ab$", "b$", `^日`, `本$`, `\bbar\b`, "(?i)^FOO", "(", "a{2,3}", `[[:alpha:]]+$`}
	texts := []string{"", "a", "aaa", "ab", "abab", "baaab", "日本語", "日a本", "\xff", "a\xffb", "\xe6\x97", "\ufffd",
		"a\ufffd\xff", "foo bar", "xfoo", "foox", "\n\na\n", "b\nb", "aXbXc", "abd", "--a=b", "日本x日本日", "FOO", "xyz",
		"a b", " a", "a\n"}
	for _, p := range patterns {
		for _, s := range texts {
			compareRegexMatch(t, p, s)
		}
	}
	for _, c := range [][4]string{
		{"urn:foo:{.*}", "urn:foo:bar:baz", "{", "}"},
		{"urn:foo:{.*}", "urn:foo:", "{", "}"},
		{"urn:foo.bar.com:{.*}", "urn:foo.bar.com:bar:baz", "{", "}"},
		{"urn:foo.bar.com:{.*}", "urn:fooXbar.com:bar:baz", "{", "}"},
		{"urn:foo.bar.com:{.*}", "urn:foo.bar.com:bar:baz", "[", "]"},
		{"urn:foo:<[a-z]+>:<[0-9]{2}>", "urn:foo:ab:12", "<", ">"},
		{"urn:foo:<[a-z]+>:<[0-9]{2}>", "urn:foo:ab:123", "<", ">"},
		{"a<)(>b", "a)(b", "<", ">"},
		{"a<x>b<", "axb", "<", ">"},
		{"a{x}b", "axb", "{{", "}"},
		{"{\\b}x", "x", "{", "}"},
	} {
		compareTemplateMatch(t, c[0], c[1], c[2], c[3])
	}
}

// FuzzRegexMatchAsOPA: wb's single search answers what OPA's regex.match does for any pattern
// and text.
func FuzzRegexMatchAsOPA(f *testing.F) {
	f.Add("^a", "baaab")
	f.Add(`\bfoo\b`, "a foo")
	f.Add(`\x{FFFD}|.$`, "a\xff\xe6\x97\ufffd")
	f.Add("(?m)^b$", "a\nb\n")
	f.Fuzz(func(t *testing.T, pattern, text string) {
		if len(pattern) > 64 || len(text) > 512 {
			return
		}
		compareRegexMatch(t, pattern, text)
	})
}

// TestRegexMatchCountsItsSearch: regex.match was refused on its worst case (the pattern's
// instructions times the text's length) before it ran, so a policy denying a list of 200
// commands at a command line's start, on a 64 KiB heredoc, was refused although its search
// reads a few runes; and so was a flag looked for in a 4 MiB text where it comes first. Its
// search now runs counting what it reads.
func TestRegexMatchCountsItsSearch(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 10 * time.Second}) // a loaded machine under -race is slow
	names := []string{"curl", "wget", "nc", "ncat", "socat", "telnet", "ssh", "scp"}
	// Names that share no prefix with their neighbours, which the parser would factor out.
	for i, x := 0, uint32(7); i < 192; i++ {
		b := make([]byte, 6+i%5)
		for j := range b {
			x = x*1664525 + 1013904223
			b[j] = 'a' + byte(x>>24)%26
		}
		names = append(names, string(b))
	}
	denied := "^(?:" + strings.Join(names, "|") + `)\b`
	heredoc := "python3 - <<'EOF'\n" + strings.Repeat("print('the answer is', 6*7)\n", 64<<10/28) + "EOF"
	flagged := "--token=abc " + strings.Repeat("python3 -c 'print(6*7)' ", 4<<20/24)
	flag := `(?:--password|--token|--secret)=\S+`
	for _, c := range []struct {
		name, pattern, text string
		deny                bool
	}{
		{"denylist", denied, heredoc, false},
		{"denylist_hit", denied, "wget " + heredoc, true},
		{"flag", flag, flagged, true},
	} {
		if err := checkRegex(c.pattern, c.text, false, false); err == nil {
			t.Fatalf("%s: the worst case fits the bound: not a test of the counted search", c.name)
		}
		project := "proj_regex_match_" + c.name
		src := "package wb.admission\n\ndeny contains \"matched\" if regex.match(input.request.metadata.pattern, input.request.metadata.text)\n"
		if _, err := e.Put(ctx, project, "match", src, ModeEnforce); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		d, err := e.Admit(ctx, admission(project, 2, map[string]string{"pattern": c.pattern, "text": c.text}))
		if err != nil {
			t.Fatal(err)
		}
		if c.deny && (d.Allow || len(d.Reasons) != 1 || d.Reasons[0] != "pol_match@1: matched") || !c.deny && !d.Allow {
			t.Errorf("%s: regex.match of a %d-byte pattern on %d bytes: %+v, want deny %v for the match", c.name,
				len(c.pattern), len(c.text), d, c.deny)
		}
		t.Logf("%s: %v", c.name, time.Since(start))
	}
}

// TestRegexMatchRefusesRealWork: a pattern of 12,000 optional atoms on 64 KiB of a's (the NFA
// steps its 24,000 threads at each byte: seconds in one call) is refused once its search has
// read its bound's worth, saying why; and at the evaluation's deadline, which the search looks
// at as it reads.
func TestRegexMatchRefusesRealWork(t *testing.T) {
	ops := []*ast.Term{ast.StringTerm("(?:" + strings.Repeat("a?", 12) + "){1000}b"), ast.StringTerm(strings.Repeat("a", 64<<10))}
	f := regexMatch(topdown.GetBuiltin(ast.RegexMatch.Name), newRegexOne)
	start := time.Now()
	_, err := callBuiltin(f, topdown.BuiltinContext{}, ops)
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "too much work for one call (its search would read more than") {
		t.Errorf("12,000 optional atoms on 64 KiB: %v, want it refused for its work", err)
	}
	// About a second, 8 s under the race detector on a loaded machine.
	if took > 40*time.Second {
		t.Errorf("refused after %v", took)
	}
	t.Logf("refused in %v: %v", took, err)

	cancel := topdown.NewCancel()
	cancel.Cancel()
	start = time.Now()
	_, err = callBuiltin(f, topdown.BuiltinContext{Cancel: cancel}, ops)
	took = time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("past the deadline: %v, want it timed out", err)
	}
	if took > 5*time.Second {
		t.Errorf("past the deadline: stopped after %v", took)
	}
	t.Logf("past the deadline: stopped in %v", took)
}

// TestRegexPatternCompiledOncePerEvaluation: a policy matching one pattern of 60,000
// instructions against 200 values compiles it once in its evaluation: each call parsed and
// compiled it three times (about 150 ms a call, 30 s for the 200), past any deadline.
func TestRegexPatternCompiledOncePerEvaluation(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 10 * time.Second})
	src := "package wb.admission\n\npattern := \"(?:" + strings.Repeat("a", 3000) + "){20}\"\n\n" +
		"deny contains \"matched\" if {\n\tsome i in numbers.range(1, 200)\n\tregex.match(pattern, sprintf(\"b%d%s\", [i, input.request.metadata.text]))\n}\n"
	if _, err := e.Put(ctx, "proj_regex_once", "once", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d, err := e.Admit(ctx, admission("proj_regex_once", 2, map[string]string{"text": strings.Repeat("a", 2<<10)}))
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allow {
		t.Errorf("200 calls of one 60,000-instruction pattern: %+v after %v, want them answered", d, took)
	}
	t.Logf("200 calls in %v", took)
}

// TestRegexTemplateMatchBoundsItsParts: OPA's regex.template_match compiles each delimited
// part alone before the whole pattern, and wb left it the calls whose pattern does not
// compile, or is within its bound: a part of 3 million instructions ("(?:…){1000}" of 3 KiB)
// took 5 s and 800 MiB in one call, past the evaluation's deadline, whether the pattern did
// not compile (a part after it that does not parse) or compiled small (a part's \Q made the
// big part literal in it). Such a template is refused, from the parts' parse trees.
func TestRegexTemplateMatchBoundsItsParts(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	big := "<(?:" + strings.Repeat("abcdefghij", 300) + "){1000}>"
	src := "package wb.admission\n\ndeny contains \"matched\" if regex.template_match(input.request.metadata.tpl, \"x\", \"<\", \">\")\n"
	for _, c := range []struct{ name, tpl string }{
		{"not_compiling", big + "<(>"},
		{"quoted", `<\Q>` + big + `\E<))(>`},
	} {
		project := "proj_tpl_" + c.name
		if _, err := e.Put(ctx, project, "tpl", src, ModeEnforce); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		d, err := e.Admit(ctx, admission(project, 2, map[string]string{"tpl": c.tpl}))
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allow || len(d.Reasons) != 1 || !strings.Contains(d.Reasons[0], "regex.template_match: a template whose parts, each compiled alone, make about") {
			t.Errorf("%s: a template of a 3,000,000-instruction part: %.300v after %v, want it refused for its parts' size", c.name, d, took)
		}
		t.Logf("%s: %v: %.300v", c.name, took, d.Reasons)
	}
	for _, c := range [][4]string{
		{`a<\Q>b`, "a$b", "<", ">"},
		{`<\Q><x>\E<y>`, ")(x)\\y", "<", ">"},
		{`<\Q><x>\E<))(>`, "", "<", ">"},
		{`<a>\Q<b>`, "ab", "<", ">"},
		{`<(>x<)>`, "x", "<", ">"},
	} {
		compareTemplateMatch(t, c[0], c[1], c[2], c[3])
	}
}

// TestLargePatternsStayOutOfOPAsCache: a large pattern on a short text, within its work
// bound, is not handed to OPA's builtin, whose cache of the last 100 patterns is the whole
// process's (every tenant's): 100 regex.match calls of distinct 60,000-instruction patterns
// held 295 MiB after a GC. Its answers stay OPA's.
func TestLargePatternsStayOutOfOPAsCache(t *testing.T) {
	match, split := regexOneReplacement(ast.RegexMatch.Name), regexAllReplacement(ast.RegexSplit.Name)
	pattern := func(i int) string { return fmt.Sprintf("%d(?:%s){20}", i, strings.Repeat("a", 3000)) }
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	for i := range 40 {
		for _, f := range []topdown.BuiltinFunc{match, split} {
			if _, err := callBuiltin(f, topdown.BuiltinContext{}, []*ast.Term{ast.StringTerm(pattern(i)), ast.StringTerm("b")}); err != nil {
				t.Fatalf("pattern %d: %v", i, err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	if held := int64(ms.HeapAlloc) - int64(before); held > 32<<20 {
		t.Errorf("80 calls of 40 distinct 60,000-instruction patterns on \"b\": the heap held %.1f MiB after them, want at most 32 (OPA's cache keeps what it compiles)", float64(held)/(1<<20))
	}
	// Answers, within the bound: a pattern of 4,203 instructions, matched by 4,201 bytes.
	small := fmt.Sprintf("0(?:%s){2}", strings.Repeat("a", 2100))
	for _, c := range []struct{ name, text string }{
		{ast.RegexMatch.Name, "b"}, {ast.RegexMatch.Name, "0" + strings.Repeat("a", 4200)}, {ast.RegexMatch.Name, "x0" + strings.Repeat("a", 4200) + "y"},
		{ast.RegexMatch.Name, "x0" + strings.Repeat("a", 4199) + "y"}, {ast.RegexSplit.Name, "b"}, {ast.RegexSplit.Name, "x0y"},
	} {
		f := map[string]topdown.BuiltinFunc{ast.RegexMatch.Name: match, ast.RegexSplit.Name: split}[c.name]
		{
			name, text := c.name, c.text
			ops := []*ast.Term{ast.StringTerm(small), ast.StringTerm(text)}
			got, err := callBuiltin(f, topdown.BuiltinContext{}, ops)
			want, werr := callBuiltin(topdown.GetBuiltin(name), topdown.BuiltinContext{}, ops)
			if (err != nil) != (werr != nil) || (err == nil && !got.Equal(want)) {
				t.Errorf("%s on a text of %d bytes: %v, %v; OPA: %v, %v", name, len(text), got, err, want, werr)
			}
		}
	}
}

// TestLargeAnchoredPatternsStayOutOfOPAsCache: a large pattern with assertions (which the
// counted searches cannot take: a search from an offset needs the text before it) whose
// all-match call is within its bound is searched here too, with its program compiled for the
// evaluation, not left in OPA's process-wide cache; and its answers are OPA's.
func TestLargeAnchoredPatternsStayOutOfOPAsCache(t *testing.T) {
	all := map[string]topdown.BuiltinFunc{}
	for _, name := range []string{ast.RegexSplit.Name, ast.RegexFind.Name, ast.RegexFindAllStringSubmatch.Name, ast.RegexReplace.Name} {
		all[name] = regexAllReplacement(name)
	}
	opsFor := func(name, pattern, text string) []*ast.Term {
		ops := []*ast.Term{ast.StringTerm(pattern), ast.StringTerm(text)}
		switch name {
		case ast.RegexFind.Name, ast.RegexFindAllStringSubmatch.Name:
			ops = append(ops, ast.IntNumberTerm(-1))
		case ast.RegexReplace.Name:
			ops = append(ops, ast.StringTerm("<$1>"))
		}
		return ops
	}
	pattern := func(i int) string { return fmt.Sprintf(`\b%d(?:%s){20}`, i, strings.Repeat("a", 3000)) }
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	for i := range 40 {
		for _, name := range []string{ast.RegexSplit.Name, ast.RegexFind.Name} {
			if _, err := callBuiltin(all[name], topdown.BuiltinContext{}, opsFor(name, pattern(i), "b")); err != nil {
				t.Fatalf("%s, pattern %d: %v", name, i, err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	if held := int64(ms.HeapAlloc) - int64(before); held > 32<<20 {
		t.Errorf("80 calls of 40 distinct 60,000-instruction patterns with assertions on \"b\": the heap held %.1f MiB after them, want at most 32 (OPA's cache keeps what it compiles)", float64(held)/(1<<20))
	}
	// Answers, within the bound: patterns of over 4,096 instructions (an alternative that
	// never matches here) with each kind of assertion, matching several times, empty matches
	// included, on texts short enough for their bound.
	long := strings.Repeat("x", 4200)
	for _, pattern := range []string{
		`(?m)^(0|` + long + `)$`, `\b(0|` + long + `)\b`, `(?:0|` + long + `)(\B|$)`, `\A(0|` + long + `)?`,
		`(?m)(^|y)(?:0|` + long + `)?`, `(0|` + long + `)\z`,
	} {
		for _, text := range []string{"", "b", "0", "0 0\n0\n00 a", "y0 0y\n\n0", "\n\n0\ny", "00y0\n"} {
			for name, f := range all {
				ops := opsFor(name, pattern, text)
				got, err := callBuiltin(f, topdown.BuiltinContext{}, ops)
				want, werr := callBuiltin(topdown.GetBuiltin(name), topdown.BuiltinContext{}, ops)
				if (err != nil) != (werr != nil) || (err == nil && !got.Equal(want)) {
					t.Errorf("%s(%.20q…, a text of %d bytes): %v, %v; OPA: %v, %v", name, pattern, len(text), got, err, want, werr)
				}
			}
		}
	}
}
