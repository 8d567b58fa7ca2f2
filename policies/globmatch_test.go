package policies

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/glob"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// TestGlobMatchAnswersAsOPA: glob.match, matched by regexp (its search counted or not),
// answers as the glob package does for each pattern, delimiters and text, and fails where it
// fails.
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
				// The same search counted, as on a long text.
				var counted *ast.Term
				err = matchGlob(topdown.BuiltinContext{}, []*ast.Term{ast.StringTerm(p), dterm, ast.StringTerm(s)},
					func(t *ast.Term) error { counted = t; return nil }, measuredRegexOne)
				if err != nil || !counted.Equal(got) {
					t.Errorf("glob.match(%q, %q, %q) counted = %v, %v; want %v", p, string(delims), s, counted, err, got)
				}
			}
		}
	}
}

// TestGlobMatchRefusalFailsClosed: glob.match's refusals were errors OPA records and goes on
// from, the call undefined, so that a rule denying a command by glob was skipped for a
// command long enough to be refused: the create was allowed. A refusal now stops the
// evaluation, which fails closed; and a glob whose search ends early (an anchored start that
// does not match) is taken on a text of any length, its search counted as it reads.
func TestGlobMatchRefusalFailsClosed(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 10 * time.Second})
	long := strings.Repeat("python3 -c 'print(6*7)' ", 4<<20/24)
	for _, c := range []struct {
		name, glob, text string
		allow            bool
	}{
		{"refused", "*{curl,wget,nc}*", long + " curl", false},
		{"early", "{curl,wget,nc,ncat,socat,telnet,ssh,scp} *", long, true},
	} {
		if expr, err := globRegexp(c.glob, nil); err != nil || checkRegex(expr, c.text, false, false) == nil {
			t.Fatalf("%s: %v: the worst case fits the bound: not a test of a refusal or of the counted search", c.name, err)
		}
		project := "proj_glob_" + c.name
		src := "package wb.admission\n\ndeny contains \"denied\" if glob.match(input.request.metadata.glob, [], input.request.metadata.text)\n"
		if _, err := e.Put(ctx, project, "glob", src, ModeEnforce); err != nil {
			t.Fatal(err)
		}
		d, err := e.Admit(ctx, admission(project, 2, map[string]string{"glob": c.glob, "text": c.text}))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allow != c.allow {
			t.Errorf("%s: glob.match(%q) on %d bytes: %+v, want allow %v", c.name, c.glob, len(c.text), d, c.allow)
		}
		t.Logf("%s: %.300v", c.name, d.Reasons)
	}
}

// TestGlobMatchUntranslatableFailsClosed: a glob the glob package takes but whose regular
// expression Go's parser refuses (alternatives nested 1,250 deep: "expression nests too
// deeply") was a plain error, which OPA records and goes on from, the call undefined: a
// rule denying by it was skipped where OPA's builtin matches and denies. It is a refusal,
// which stops the evaluation.
func TestGlobMatchUntranslatableFailsClosed(t *testing.T) {
	ctx := context.Background()
	deep := strings.Repeat("{a,c", 1250) + "b" + strings.Repeat("}", 1250)
	g, err := glob.Compile(deep)
	if err != nil || !g.Match("a") {
		t.Fatalf("the glob package: %v, want it to match", err)
	}
	e := newEngine(t, nil, Options{EvalTimeout: 10 * time.Second})
	src := "package wb.admission\n\ndeny contains \"denied\" if glob.match(input.request.metadata.glob, null, \"a\")\n"
	if _, err := e.Put(ctx, "proj_glob_deep", "glob", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission("proj_glob_deep", 2, map[string]string{"glob": deep}))
	if err != nil {
		t.Fatal(err)
	}
	if d.Allow {
		t.Errorf("glob.match of alternatives nested 1,250 deep, which OPA matches: %.300v, want the create denied", d)
	}
	t.Logf("%.300v", d.Reasons)
}
