package policies

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/topdown"
)

// TestLargeAssertedPatternsAnswerAsOPA: random patterns with assertions (^ $ \b \B \A \z,
// multi-line or not, empty matches), made large (over maxOPACachedInsts) by an alternative
// that never matches, so that wb searches them over the whole text (regexAll.whole), answer
// what OPA's builtins do for random texts (several-byte runes, an invalid byte, newlines),
// each n, and replacement values with expansions.
func TestLargeAssertedPatternsAnswerAsOPA(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	atoms := []string{"a", "b", " ", ".", "^", "$", `\b`, `\B`, `\A`, `\z`, "(a)", "(a|)", "(^|b)", "a*", `(\b)`, "日", "(?:a|$)",
		`(\B|^)`, "b?", "(.)", `(?m:^)`, `(?m:$)`, `\s`, "(日|a)*", "[^a]"}
	runes := []string{"a", "b", " ", "\n", "日", "\xff", "ab", "\xe6\x97"}
	values := []string{"", "x", "$1", "${1}x", "<$0>", "$2", "$$", "$1$1"}
	long := strings.Repeat("x", 4200)
	whole := 0
	for range 300 {
		var b strings.Builder
		if rng.IntN(3) == 0 {
			b.WriteString("(?m)")
		}
		for range 1 + rng.IntN(4) {
			b.WriteString(atoms[rng.IntN(len(atoms))])
			if rng.IntN(5) == 0 {
				b.WriteString("|")
			}
		}
		core := strings.TrimSuffix(b.String(), "|")
		pattern := "(?:" + core + ")|" + long
		if rng.IntN(2) == 0 {
			pattern = long + "|(?:" + core + ")"
		}
		p := newRegexProgram(pattern)
		if p.err != nil || p.insts == 0 || p.free {
			continue
		}
		ctx := withRegexCache(context.Background(), &regexCache{})
		for range 20 {
			var tb strings.Builder
			for range rng.IntN(12) {
				tb.WriteString(runes[rng.IntN(len(runes))])
			}
			text := tb.String()
			if a := newRegexAll(p, text, true, func() bool { return false }); a != nil && a.whole {
				whole++
			}
			for name, ops := range regexAllCalls(pattern, text, values[rng.IntN(len(values))], []int{-1, 0, 1, 2, 3}[rng.IntN(5)]) {
				got, gerr := callBuiltin(regexAllReplacement(name), topdown.BuiltinContext{Context: ctx}, ops)
				want, werr := callBuiltin(topdown.GetBuiltin(name), topdown.BuiltinContext{}, ops)
				if (werr != nil) != (gerr != nil) || werr == nil && !got.Equal(want) {
					t.Errorf("%s(%q…, %v) = %v, %v; OPA answers %v, %v", name, core, ops[1:], got, gerr, want, werr)
				}
			}
		}
	}
	if whole == 0 {
		t.Fatal("no call was searched over the whole text")
	}
	t.Logf("%d calls searched over the whole text", whole)
}
