//go:build linux

package main

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEveryServerHasTimeouts: a client that opens connections and never finishes its headers,
// or idles forever, must not hold a listener's resources. Every http.Server literal in the
// module's code sets ReadHeaderTimeout and IdleTimeout.
func TestEveryServerHasTimeouts(t *testing.T) {
	root := filepath.Join("..", "..")
	found := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Server" {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "http" {
				return true
			}
			found++
			keys := map[string]bool{}
			for _, el := range lit.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if id, ok := kv.Key.(*ast.Ident); ok {
						keys[id.Name] = true
					}
				}
			}
			for _, want := range []string{"ReadHeaderTimeout", "IdleTimeout"} {
				if !keys[want] {
					t.Errorf("%s: an http.Server without %s", path, want)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 4 {
		t.Fatalf("found %d http.Server literals; the walk missed the module's code", found)
	}
}

// TestNodeToken: the node's token never comes from the command line alone.
func TestNodeToken(t *testing.T) {
	var out, errb strings.Builder
	err := run(context.Background(), []string{"node", "--redis", "redis://127.0.0.1:1", "--token", "secret"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "--token-file") || !strings.Contains(err.Error(), "WB_NODE_TOKEN") {
		t.Fatalf("--token on the command line: %v", err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("wb_node_abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cli        bool
		file, env  string
		want, fail string
	}{
		{file: file, want: "wb_node_abc"},
		{file: file, env: "from_env", want: "wb_node_abc"},
		{env: "from_env", want: "from_env"},
		{cli: true, env: "from_env", fail: "--token is refused"},
		{file: empty, fail: "is empty"},
		{file: filepath.Join(dir, "missing"), fail: "--token-file"},
		{fail: "--token-file FILE, or $WB_NODE_TOKEN"},
	} {
		got, err := nodeToken(c.cli, c.file, c.env)
		if c.fail != "" {
			if err == nil || !strings.Contains(err.Error(), c.fail) {
				t.Errorf("%+v: %q, %v; want an error with %q", c, got, err, c.fail)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%+v: %q, %v", c, got, err)
		}
	}
}

// startServe runs `wb serve --runtime none` with extra args and answers its printed env.
func startServe(t *testing.T, args ...string) map[string]string {
	t.Helper()
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--addr", "127.0.0.1:0", "--runtime", "none", "--data-dir", t.TempDir(), "--log-level", "error"}, args...), pw, io.Discard)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop within 30 s of its context ending")
		}
	})
	lines := make(chan string, 1)
	go func() {
		b := make([]byte, 4096)
		var got string
		for strings.Count(got, "\n") < 3 {
			n, err := pr.Read(b)
			if err != nil {
				break
			}
			got += string(b[:n])
		}
		lines <- got
		_, _ = io.Copy(io.Discard, pr)
	}()
	env := map[string]string{}
	select {
	case got := <-lines:
		for _, l := range strings.Split(strings.TrimSpace(got), "\n") {
			k, v, _ := strings.Cut(l, "=")
			env[k] = v
		}
	case err := <-done:
		t.Fatalf("wb serve ended: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("wb serve printed nothing in 60 s")
	}
	return env
}

func getStatus(t *testing.T, url, key string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestServeMetrics: /metrics answers the admin key or --metrics-token, or only on
// --metrics-addr.
func TestServeMetrics(t *testing.T) {
	env := startServe(t, "--metrics-token", "wb_metrics_x")
	for key, want := range map[string]int{"": 401, env["WB_API_KEY"]: 401, env["WB_ADMIN_KEY"]: 200, "wb_metrics_x": 200} {
		if got := getStatus(t, env["WB_URL"]+"/metrics", key); got != want {
			t.Errorf("/metrics with key %q: %d, want %d", key, got, want)
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	env = startServe(t, "--metrics-addr", addr)
	if got := getStatus(t, env["WB_URL"]+"/metrics", env["WB_ADMIN_KEY"]); got != 404 {
		t.Errorf("API /metrics with --metrics-addr: %d, want 404", got)
	}
	if got := getStatus(t, "http://"+addr+"/metrics", ""); got != 200 {
		t.Errorf("/metrics on --metrics-addr: %d, want 200", got)
	}
}
