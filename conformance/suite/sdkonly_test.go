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
// for the type of the client a caller may hand the SDK and a status constant. MCP, which
// wb/client does not speak, goes through the official MCP SDK's Streamable HTTP transport
// over the wb SDK's MCPHTTPClient (its key, its User-Agent, the caller's transport): no other
// MCP transport, and no HTTP client of the suite's own making.
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
		checkMCP(t, fset, name, f)
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

// checkMCP fails a file of the suite that uses an MCP client transport other than the
// Streamable HTTP one, or gives that one an HTTP client that is not MCPHTTPClient's.
func checkMCP(t *testing.T, fset *token.FileSet, name string, f *ast.File) {
	t.Helper()
	mcpName := ""
	for _, imp := range f.Imports {
		if path, _ := strconv.Unquote(imp.Path.Value); path == "github.com/modelcontextprotocol/go-sdk/mcp" {
			mcpName = "mcp"
			if imp.Name != nil {
				mcpName = imp.Name.Name
			}
		}
	}
	if mcpName == "" {
		return
	}
	isMCP := func(e ast.Expr, sel string) bool {
		s, ok := e.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		id, ok := s.X.(*ast.Ident)
		return ok && id.Name == mcpName && (sel == "" || s.Sel.Name == sel)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if isMCP(n, "") && strings.HasSuffix(n.Sel.Name, "Transport") && n.Sel.Name != "StreamableClientTransport" {
				t.Errorf("%s: mcp.%s: the suite's MCP client speaks Streamable HTTP only, over the wb SDK's MCPHTTPClient", fset.Position(n.Pos()), n.Sel.Name)
			}
		case *ast.CompositeLit:
			if !isMCP(n.Type, "StreamableClientTransport") {
				return true
			}
			ok := false
			for _, el := range n.Elts {
				kv, isKV := el.(*ast.KeyValueExpr)
				if !isKV {
					continue
				}
				if key, isID := kv.Key.(*ast.Ident); !isID || key.Name != "HTTPClient" {
					continue
				}
				call, isCall := kv.Value.(*ast.CallExpr)
				if isCall {
					sel, isSel := call.Fun.(*ast.SelectorExpr)
					ok = isSel && sel.Sel.Name == "MCPHTTPClient"
				}
			}
			if !ok {
				t.Errorf("%s: an mcp.StreamableClientTransport whose HTTPClient is not the wb SDK's MCPHTTPClient()", fset.Position(n.Pos()))
			}
		}
		return true
	})
}
