package policies

import (
	"context"
	"io/fs"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/tester"
)

// TestShippedRego runs the shipped *_test.rego through OPA's tester, as `opa test policies/`
// does, with the engine's capabilities and bounded builtins (so a shipped rule cannot rely on
// a denied builtin).
func TestShippedRego(t *testing.T) {
	files, err := fs.Glob(shippedFS, "*.rego")
	if err != nil {
		t.Fatal(err)
	}
	mods := map[string]*ast.Module{}
	for _, f := range files {
		src, err := shippedFS.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := ast.ParseModuleWithOpts(f, string(src), ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		mods[f] = m
	}
	var bounded []*tester.Builtin
	for _, f := range boundedFunctions() {
		bounded = append(bounded, &tester.Builtin{Func: f})
	}
	ch, err := tester.NewRunner().SetCompiler(newCompiler(capabilities())).AddCustomBuiltins(bounded).
		SetModules(mods).RunTests(withBudget(context.Background(), 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for r := range ch {
		n++
		switch {
		case r.Error != nil:
			t.Errorf("%s.%s: error: %v", r.Package, r.Name, r.Error)
		case r.Fail:
			t.Errorf("%s.%s: FAIL at %v", r.Package, r.Name, r.Location)
		case r.Skip:
			t.Logf("%s.%s: skipped", r.Package, r.Name)
		}
	}
	if n < 30 {
		t.Errorf("ran %d Rego tests, want the shipped ones (≥ 30)", n)
	}
	t.Logf("%d Rego tests", n)
}
