package policies

import (
	"testing"

	"github.com/gobwas/glob"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// TestGlobMatchAnswersAsOPA: glob.match, matched by regexp, answers as the glob package does
// for each pattern, delimiters and text, and fails where it fails.
func TestGlobMatchAnswersAsOPA(t *testing.T) {
	patterns := []string{"", "*", "**", "?", "a*", "*.example.com", "**.example.com", "tpl_*_v?", "a?c", "[abc]x", "[!abc]x",
		"[a-c]*", "[!a-c]*", "{a,b}c", "{a,b*,}x", "{a,{b,c}d}e", `\*x`, `a\?`, "[.]", "[!.]", "*[-]*", "[\\]]", "x{,y}",
		"*{a,b}a*{a,b}a*c*", "a**b", "a*.b?", "日*本", "[日-本]", "{", "[", "a[", "[]", "{a", "[z-a]"}
	texts := []string{"", "a", "ab", "abc", "bx", "dx", "ax", "cx", ".x", "*x", "a?", "ab.b.c", "www.example.com",
		"example.com", "a.example.com", "tpl_dev_v2", "tpl_dev_v22", "ac", "bc", "cc", "x", "xy", "ae", "bde", "de", "-",
		"a-b", "]", ".", "aaaac", "ab.ab", "a.b.b", "a\nb", "日x本", "本", "日"}
	for _, delims := range [][]rune{nil, {'.'}, {'.', '-'}} {
		var dterm *ast.Term
		if delims == nil {
			dterm = ast.NullTerm()
		} else {
			var ts []*ast.Term
			for _, d := range delims {
				ts = append(ts, ast.StringTerm(string(d)))
			}
			dterm = ast.ArrayTerm(ts...)
		}
		for _, p := range patterns {
			g, gerr := glob.Compile(p, delims...)
			for _, s := range texts {
				var got *ast.Term
				err := globMatch(topdown.BuiltinContext{}, []*ast.Term{ast.StringTerm(p), dterm, ast.StringTerm(s)},
					func(t *ast.Term) error { got = t; return nil })
				if gerr != nil {
					if err == nil {
						t.Errorf("glob.match(%q, %q, %q) = %v, want the error %v", p, string(delims), s, got, gerr)
					}
					continue
				}
				if err != nil {
					t.Errorf("glob.match(%q, %q, %q): %v", p, string(delims), s, err)
					continue
				}
				if want := ast.BooleanTerm(g.Match(s)); !got.Equal(want) {
					t.Errorf("glob.match(%q, %q, %q) = %v, want %v", p, string(delims), s, got, want)
				}
			}
		}
	}
}
