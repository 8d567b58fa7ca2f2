package suite

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestChecksUseTheSDKOnly: the suite speaks to a deployment through wb/client alone. Its
// files (tests aside) import no HTTP or WebSocket client of their own, and use net/http only
// for the type of the client a caller may hand the SDK and a status constant.
func TestChecksUseTheSDKOnly(t *testing.T) {
	allowedHTTP := map[string]bool{"Client": true, "StatusNotFound": true}
	forbidden := []string{"net", "net/http/httputil", "github.com/coder/websocket", "golang.org/x/net/websocket", "github.com/gorilla/websocket"}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		httpName := ""
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range forbidden {
				if path == bad {
					t.Errorf("%s imports %s: talk to the deployment through wb/client", name, path)
				}
			}
			if path == "net/http" {
				httpName = "http"
				if imp.Name != nil {
					httpName = imp.Name.Name
				}
			}
		}
		if httpName == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == httpName && !allowedHTTP[sel.Sel.Name] {
				t.Errorf("%s: http.%s: no hand-rolled HTTP in the suite; add the call to wb/client", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
}
