package policies

import (
	"context"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// benchRegexCall calls the bounded builtin name on ops b.N times, each call in an evaluation
// of its own (fresh) or all in one (shared).
func benchRegexCall(b *testing.B, name string, ops []*ast.Term, shared bool) {
	evaluation := newBudget(defaultEvalMemory)
	f := boundedImpl(name, len(ops), replacement(name), boundedBuiltins[name], func(context.Context) *budget { return evaluation })
	b.ReportAllocs()
	for b.Loop() {
		if !shared {
			evaluation = newBudget(defaultEvalMemory)
		}
		if _, err := f(rego.BuiltinContext{Context: context.Background()}, ops); err != nil {
			b.Fatal(err)
		}
	}
}

// largePattern is a pattern of 60,000 instructions (3,000 a's repeated 20 times), and
// largeText a text on which its worst case passes maxRegexWork, so its search runs counted.
var (
	largePattern = ast.StringTerm("(?:" + strings.Repeat("a", 3000) + "){20}")
	largeText    = ast.StringTerm("b" + strings.Repeat("a", 2<<10))
)

// BenchmarkRegexMatchLargePattern: regex.match of a 60,000-instruction pattern, its search
// counted: the pattern's parsing and compiling dominate.
func BenchmarkRegexMatchLargePattern(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "call_per_evaluation", true: "calls_in_one_evaluation"}[shared], func(b *testing.B) {
			benchRegexCall(b, ast.RegexMatch.Name, []*ast.Term{largePattern, largeText}, shared)
		})
	}
}

// BenchmarkRegexSplitLargePattern: regex.split of the same pattern, its searches counted.
func BenchmarkRegexSplitLargePattern(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "call_per_evaluation", true: "calls_in_one_evaluation"}[shared], func(b *testing.B) {
			benchRegexCall(b, ast.RegexSplit.Name, []*ast.Term{largePattern, largeText}, shared)
		})
	}
}
