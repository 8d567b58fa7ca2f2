package policies

import (
	"context"
	"fmt"
	"regexp"
	"regexp/syntax"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// mostNamed is the longest text a refusal of checkRegexWork names.
func mostNamed(t *testing.T, err error) int {
	t.Helper()
	const at = "may take at most "
	i := strings.Index(err.Error(), at)
	if i < 0 {
		t.Fatalf("%v; want the refusal to name the longest text", err)
	}
	most := 0
	for _, c := range err.Error()[i+len(at):] {
		if c < '0' || c > '9' {
			break
		}
		most = most*10 + int(c-'0')
	}
	return most
}

// TestRegexWorkSaysWhatWouldDo: a regex call refused for its work names the longest text its
// pattern may take, and that text is then taken. (An all-match builtin's pattern has an
// assertion here: without one, its searches are counted as they run, TestRegexAll*.)
func TestRegexWorkSaysWhatWouldDo(t *testing.T) {
	for _, all := range []bool{false, true} {
		err := checkRegex(`\s+\b`, strings.Repeat("a ", 1<<24), all, false)
		if err == nil {
			t.Fatalf("all %v: 32 MiB of text taken", all)
		}
		// Matches everywhere: the bound whatever the matches, for the all-match builtins.
		most := mostNamed(t, err)
		if err := checkRegex(`\s+\b`, strings.Repeat("a ", most/2+1)[:most], all, false); err != nil {
			t.Errorf("all %v: a text of the %d bytes named: %v", all, most, err)
		}
		if err := checkRegex(`\s+\b`, strings.Repeat("a ", most/2+1)[:most+1], all, false); err == nil {
			t.Errorf("all %v: a text of %d bytes, one past the %d named, is taken", all, most+1, most)
		}
	}
}

// TestRegexWorkCountsMatches: an all-match builtin (regex.replace, split, find_n) on a long
// text, its pattern with an assertion, is taken when its matches are few enough for its
// searches to stay within the work bound (a PATH of 20 KiB split on its colons, 512 KiB
// searched for its flags), and refused, saying why, when they are not (".*b|a\B" over a's: a
// search to the end of the text for each a).
func TestRegexWorkCountsMatches(t *testing.T) {
	path := strings.Repeat("/opt/toolchains/some-vendor/release-2026.11/bin:", 100) // 20 KiB
	if err := checkRegex(`\b:`, path, true, false); err != nil {
		t.Errorf("a 20 KiB PATH split on its colons: %v", err)
	}
	long := strings.Repeat("python3 -c 'print(6*7)' ", 512<<10/24) + "--token=abc"
	if err := checkRegex(`\B--[a-z-]+=\S+`, long, true, false); err != nil {
		t.Errorf("a 512 KiB command line's flags: %v", err)
	}
	err := checkRegex(`.*b|a\B`, strings.Repeat("a", 16<<10), true, false)
	if err == nil || !strings.Contains(err.Error(), "whatever its matches, as this builtin searches again after each match") {
		t.Fatalf(".*b|a\\B over 16 KiB of a's: %v; want it refused, saying why", err)
	}
	if most := mostNamed(t, err); checkRegex(`.*b|a\B`, strings.Repeat("a", most), true, false) != nil {
		t.Errorf(".*b|a\\B over the %d a's named is refused", most)
	}
	// An empty match after each match makes two searches a match: still counted within the bound.
	if err := checkRegex(`a*\B`, strings.Repeat("ab", 8<<10), true, false); err == nil {
		t.Errorf("a*\\B over 16 KiB of ab: taken")
	}
	// Without an assertion the call is not refused up front: its searches are counted as they
	// run (regexall.go).
	if err := checkRegex(`.*b|a`, strings.Repeat("a", 16<<10), true, false); err != nil {
		t.Errorf(".*b|a over 16 KiB of a's, refused up front: %v", err)
	}
}

// TestRegexTooLargeRefused: patterns cheap to write but long to parse or compile (classes
// the parser expands to their ranges, repeats that copy their body) are refused whatever
// their text.
func TestRegexTooLargeRefused(t *testing.T) {
	for _, p := range []string{
		strings.Repeat(`\pL`, 1<<16),
		"(?:" + strings.Repeat("a", 3072) + "){1000}",
		strings.Repeat(`[\pL\pN]`, 200),
	} {
		if err := checkRegex(p, "", false, false); err == nil {
			t.Errorf("a pattern of %d bytes (%.16s…) is taken on an empty text, want it refused", len(p), p)
		}
	}
	if err := checkRegex(`^[\pL\pN_.-]+(?:\s+--?[a-z][a-z0-9-]*(?:=\S+)?)*$`, strings.Repeat("cmd --flag=value ", 240), false, false); err != nil {
		t.Errorf("a command line's pattern on 4 KiB: %v", err)
	}
}

// TestRegexIsValidBounded: regex.is_valid refuses a pattern too long to parse in one call, as
// the matching builtins do (Go's parser took a second and 190 MiB on 768 KiB of \pL).
func TestRegexIsValidBounded(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	src := "package wb.admission\n\npattern := concat(\"\", [\"a\", strings.replace_n({\"b\": \"a\"}, \"" + strings.Repeat("b", maxRegexPattern) + "\")])\n\n" +
		"deny contains \"valid\" if regex.is_valid(pattern)\n"
	if _, err := e.Put(ctx, "proj_is_valid", "isvalid", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission("proj_is_valid", 2, nil))
	if err != nil {
		t.Fatal(err)
	}
	if d.Allow || len(d.Reasons) != 1 || !strings.Contains(d.Reasons[0], "longer than") {
		t.Errorf("regex.is_valid of a pattern of %d bytes: %+v, want the call refused", maxRegexPattern+1, d)
	}
}

// TestRegexGroupsCounted: a call that answers its groups' positions is refused a pattern of
// thousands of groups even on an empty text (the matcher copies every thread's positions at
// each step: 1 s there), and takes a pattern of a few groups on a text of a kilobyte.
func TestRegexGroupsCounted(t *testing.T) {
	if err := checkRegex(strings.Repeat("(a?)", 4000), "", true, true); err == nil {
		t.Error("4,000 groups on an empty text are taken, want them refused")
	}
	if err := checkRegex(`(\S+)=(\S+)`, strings.Repeat("k=v ", 256), true, true); err != nil {
		t.Errorf("2 groups on 1 KiB: %v", err)
	}
}

// TestRegexAllFrequentMatches: an all-match builtin whose pattern matches often on a long
// text (a 20 KiB command line split on its 3,000 runs of spaces, a 64 KiB CSV line's commas
// replaced) is taken: its searches are short, and their work is what is counted.
func TestRegexAllFrequentMatches(t *testing.T) {
	ctx := context.Background()
	// The deadline is far: the race detector slows regexp twentyfold, and this is about the
	// work bound (without it, both calls take about 20 ms).
	e := newEngine(t, nil, Options{EvalTimeout: time.Minute})
	var cmd strings.Builder
	for i := 0; cmd.Len() < 20<<10; i++ {
		fmt.Fprintf(&cmd, "--opt%d=v  ", i%1000)
	}
	csv := strings.Repeat("12345,abcde,", 64<<10/12)
	src := "package wb.admission\n\n" +
		"pieces := regex.split(`\\s+`, input.request.metadata.cmd)\n\n" +
		"semi := regex.replace(input.request.metadata.csv, `,`, \";\")\n\n" +
		"deny contains sprintf(\"%d pieces, %d semicolons\", [count(pieces), count(indexof_n(semi, \";\"))])\n"
	if _, err := e.Put(ctx, "proj_regex_often", "often", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d, err := e.Admit(ctx, admission("proj_regex_often", 2, map[string]string{"cmd": cmd.String(), "csv": csv}))
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d pieces, %d semicolons", len(regexp.MustCompile(`\s+`).Split(cmd.String(), -1)), strings.Count(csv, ","))
	if len(d.Reasons) != 1 || !strings.HasSuffix(d.Reasons[0], ": "+want) {
		t.Fatalf("%+v, want the one reason %q", d, want)
	}
	t.Logf("split of %d bytes and replace of %d bytes evaluated in %v", cmd.Len(), len(csv), took)
}

// TestRegexUnicodeClassesCountedBeforeParsing: a pattern whose Unicode class escapes (\pL,
// \p{Greek}) would expand past maxRegexRunes is refused from its text, before Go's parser
// expands them (16 KiB of \pL took 175 ms to parse before the check on the parse refused it);
// escapes that are not classes are not counted, and patterns with a few classes are taken.
func TestRegexUnicodeClassesCountedBeforeParsing(t *testing.T) {
	for _, p := range []string{strings.Repeat(`\pL`, maxRegexPattern/3), strings.Repeat(`[\p{L}\PN]`, 800), strings.Repeat(`\p{^Lu}`, 2000)} {
		err := checkRegex(p, "", false, false)
		if err == nil || !strings.Contains(err.Error(), "Unicode classes") {
			t.Errorf("%.20s…: %v, want refused for its Unicode classes", p, err)
		}
	}
	for p, want := range map[string]int64{
		`^[\p{L}\p{N}_.-]+$`: unicodeRunes("L") + unicodeRunes("N"), `\p{Greek}+\PL`: unicodeRunes("Greek") + unicodeRunes("L"),
		`\\pL`: 0, `\Q\pL\E\pN`: unicodeRunes("N"), `\Q\pL`: 0, `\p{Nope}`: 0, `\pZ\p`: unicodeRunes("Z"),
	} {
		if got := unicodeClassRunes(p); got != want {
			t.Errorf("unicodeClassRunes(%q) = %d, want %d", p, got, want)
		}
		if err := checkRegex(p, "text", false, false); err != nil && p != `\p{Nope}` && p != `\pZ\p` {
			t.Errorf("%q: %v", p, err)
		}
	}
	if err := checkRegex(strings.Repeat(`\p{Greek}`, 1000), "", false, false); err != nil {
		t.Errorf("a thousand \\p{Greek}: %v", err)
	}
}

// TestRegexIsValidCountsUnicodeClasses: regex.is_valid, which compiles its pattern, is
// refused one whose Unicode classes would expand past maxRegexRunes, like the builtins that
// use a pattern (16 KiB of \pL took 250 ms and 68 MiB to compile).
func TestRegexIsValidCountsUnicodeClasses(t *testing.T) {
	est := boundedBuiltins["regex.is_valid"].estimate
	never := func() bool { return false }
	if _, err := est([]*ast.Term{ast.StringTerm(strings.Repeat(`\pL`, maxRegexPattern/3))}, defaultEvalMemory, never); err == nil {
		t.Error("16 KiB of \\pL taken")
	}
	for _, p := range []string{`^[\p{L}\p{N}_.-]+$`, `(`, `\p{Nope}`} {
		if _, err := est([]*ast.Term{ast.StringTerm(p)}, defaultEvalMemory, never); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
}

// TestRegexReplaceNamedRefs: regex.replace's value is expanded at every match, regexp looking
// each reference by name up among the pattern's groups: 200,000 references to a name no group
// has, with 100 groups matching empty over 40 bytes (a second in one call), are refused up
// front, saying why; a few named references on a 64 KiB CSV line are taken.
func TestRegexReplaceNamedRefs(t *testing.T) {
	for value, want := range map[string]int64{"$1": 0, "${1}": 0, "$123456789": 0, "$0": 0, "$a": 1, "${k}:${v}": 2, "$01": 1,
		"$$a": 0, "$1234567890": 1, "$1a": 1, "$": 0, "${": 0, "${a": 1, "$-": 0, "$日": 1, "$\u0663": 1, "$$$a": 1} {
		if got := namedRefs(value); got != want {
			t.Errorf("namedRefs(%q) = %d, want %d", value, got, want)
		}
	}
	name := ast.RegexReplace.Name
	call := func(text, pattern, value string) (*ast.Term, error) {
		f := boundedImpl(name, 3, replacement(name), boundedBuiltins[name], func(context.Context) *budget { return newBudget(32 << 20) })
		return f(rego.BuiltinContext{Context: context.Background(), Cancel: topdown.NewCancel()},
			[]*ast.Term{ast.StringTerm(text), ast.StringTerm(pattern), ast.StringTerm(value)})
	}
	start := time.Now()
	_, err := call(strings.Repeat("a", 40), strings.Repeat("()", 100), strings.Repeat("$a", 200<<10))
	if err == nil || !strings.Contains(err.Error(), "204800 references by name, each looked up among the pattern's 100 groups") {
		t.Errorf("200,000 named references on 100 groups over 40 bytes: %v after %v, want it refused for them", err, time.Since(start))
	}
	csv := strings.Repeat("12345,abcde;", 64<<10/12)
	pattern, value := `(?P<a>\d+),(?P<b>\w+)`, "${b},${a}"
	got, err := call(csv, pattern, value)
	if want := regexp.MustCompile(pattern).ReplaceAllString(csv, value); err != nil || got == nil || string(got.Value.(ast.String)) != want {
		t.Errorf("a 64 KiB CSV line's fields swapped by name: %v", err)
	}
}

// TestRegexFoldedRangesRefused: under (?i) Go's parser folds each rune of a class range
// that is not all of 'A' to its last rune with a case, one at a time: 16 KiB of
// (?i)[B-\x{1E942}] took 3 to 4 s to parse, its merged classes small. Such patterns are
// refused from their text, in a millisecond, however their ranges are written; ordinary
// case-insensitive classes are taken.
func TestRegexFoldedRangesRefused(t *testing.T) {
	fill := func(prefix, unit, suffix string) string {
		return prefix + strings.Repeat(unit, (maxRegexPattern-len(prefix)-len(suffix))/len(unit)) + suffix
	}
	for _, p := range []string{
		fill("(?i)", `[B-\x{1E942}]`, ""),
		fill("(?i)[", `B-\x{1E942}`, "]"),
		fill("(?i)", `[\x42-\x{1e942}]`, ""),
		fill("(?i)", `[\102-𞥂]`, ""),
		fill("(?i)", `[\--\x{1E942}]`, ""),
		fill("(?i)", `[]-\x{1E942}]`, ""),
		fill("(?i)", `[^B-\x{1E942}]`, ""),
		fill("(?i)", `[[:alpha:]\pLB-\x{1E942}]`, ""),
		fill(`\Q[\E(?mi:`, `[B-\x{1E942}]`, ")"),
		fill("(?U)(?i)", `[\d\x41-\x{1E900}]`, ""),
	} {
		start := time.Now()
		err := checkRegex(p, "", false, false)
		if err == nil {
			t.Errorf("%.40q... (%d bytes) was taken (in %v)", p, len(p), time.Since(start))
		} else if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("%.40q... was refused in %v", p, d)
		}
	}
	for _, p := range []string{`(?i)^[a-z0-9_-]+$`, `(?i)[\p{L}\d]+`, `(?i)[\x{100}-\x{17F}]`, `(?i)[^\x00-\x1F]`,
		`(?i)[\x{0}-\x{10FFFF}]`, `(?i)[\x{41}-\x{1E943}]`, strings.Repeat(`(?i)[\pL-\x{1E942}]`, 10), `[B-\x{1E942}]{1,3}`, `(?i)[B-\x{1E942}]`} {
		if err := checkRegex(p, "some text", false, false); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
}

// TestUnicodeClassNamesAsGo: the count of a pattern's Unicode classes reads their names as
// Go's parser does, whatever their case, spaces and underscores, or alias (\p{l} and
// \p{letter} are \pL): 16 KiB of \p{l} went uncounted, and took 100 ms and more to parse.
func TestUnicodeClassNamesAsGo(t *testing.T) {
	want := unicodeClassRunes(`\pL`)
	for _, p := range []string{`\p{L}`, `\p{l}`, `\p{letter}`, `\p{Letter}`, `\P{^ l }`, `\p{LETTER}`} {
		if got := unicodeClassRunes(p); got != want {
			t.Errorf("%s counts %d runes, \\pL %d", p, got, want)
		}
	}
	for _, p := range []string{`\p{greek}`, `\p{GREEK}`, `\p{Assigned}`, `\p{ascii}`, `\p{lc}`, `\p{cased_letter}`, `\p{Decimal_Number}`} {
		if got := unicodeClassRunes(p); got == 0 {
			t.Errorf("%s counts no runes", p)
		}
	}
	// Every name Go's parser takes is counted, and no other.
	var names []string
	for _, m := range []map[string]*unicode.RangeTable{unicode.Categories, unicode.Scripts} {
		for name := range m {
			names = append(names, name)
		}
	}
	for alias := range unicode.CategoryAliases {
		names = append(names, alias)
	}
	for _, name := range append(names, "Any", "ASCII", "assigned", "LC", "Lc", "é", "Lé", "Nope") {
		for _, n := range []string{name, strings.ToLower(name), strings.ToUpper(name), strings.ReplaceAll(name, "_", " ")} {
			_, err := syntax.Parse(`\p{`+n+`}`, syntax.Perl)
			if got := unicodeClassRunes(`\p{` + n + `}`); (got > 0) != (err == nil) {
				t.Errorf("\\p{%s}: counted %d runes, Go's parser: %v", n, got, err)
			}
		}
	}
	start := time.Now()
	p := strings.Repeat(`\p{l}`, maxRegexPattern/5)
	if err := checkRegex(p, "", false, false); err == nil || time.Since(start) > 50*time.Millisecond {
		t.Errorf("16 KiB of \\p{l}: %v in %v, want refused from the text", err, time.Since(start))
	}
}

// TestRegexCacheBoundsItsClasses: an evaluation's pattern cache kept 64 patterns of at most
// 65,536 instructions together, but a class is one instruction holding its ranges: 64
// patterns of 87 \pL each (300 bytes, 87 instructions) held 28 MiB for the evaluation's
// life, charged to nothing. The runes of the cached patterns' classes and literals are
// bounded together too, as one pattern's are.
func TestRegexCacheBoundsItsClasses(t *testing.T) {
	var c regexCache
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	for i := range 64 {
		p := c.program(fmt.Sprintf("%d(?:%s)", i, strings.Repeat(`\pL`, 87)))
		if p.err != nil || p.compiled() == nil {
			t.Fatalf("pattern %d: %v", i, p.err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	var runes int64
	for pattern := range c.programs {
		re, err := syntax.Parse(pattern, syntax.Perl)
		if err != nil {
			t.Fatal(err)
		}
		_, r := progSize(re)
		runes += r
	}
	if runes > maxRegexRunes {
		t.Errorf("the cache holds %d patterns whose classes and literals hold %d runes, want at most %d", len(c.programs), runes, maxRegexRunes)
	}
	t.Logf("%d patterns cached, %d runes: heap +%d KiB", len(c.programs), runes, (int64(ms.HeapAlloc)-int64(before))>>10)
	runtime.KeepAlive(&c)
}
