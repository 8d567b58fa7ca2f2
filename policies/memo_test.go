package policies

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The shipped runtime policy is deterministic, so its documents are remembered by input; a
// module that asks the clock, the network or chance is not.
func TestNondeterministicCalls(t *testing.T) {
	e := newEngine(t, nil, Options{})
	if !e.shipped[PointRuntime].deterministic {
		t.Errorf("the shipped runtime policy counts as nondeterministic: its decisions are evaluated every time")
	}
	for _, c := range []struct {
		src  string
		want []string
	}{
		{`package wb.runtime
kill.x := "m" if { input.argv[0] == "xmrig" }`, nil},
		{`package wb.runtime
kill.late := "m" if { time.now_ns() > 0 }`, []string{"time.now_ns"}},
		{`package wb.runtime
kill.lucky := "m" if { rand.intn("k", 10) == 1 }
allow_egress if { http.send({"method": "GET", "url": input.host}).status_code == 200 }`, []string{"rand.intn", "http.send"}},
	} {
		mod, err := ast.ParseModuleWithOpts("p.rego", c.src, ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			t.Fatal(err)
		}
		got := nondeterministicCalls(mod)
		slices.Sort(got)
		slices.Sort(c.want)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: nondeterministic calls %v, want %v", c.src, got, c.want)
		}
	}
}

// TestRuntimeRemembersTheShippedDocument: a second decision on the same input takes the
// shipped policy's document from the memo, decides as the first did and is logged as well;
// another input is evaluated; the memo stays within its bound.
func TestRuntimeRemembersTheShippedDocument(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{DecisionLog: DecisionLogOptions{Buffer: 1 << 14}})
	miner := map[string]any{"type": "exec", "argv": []any{"/usr/bin/xmrig"}, "session": map[string]any{"id": "sess_m", "tier": 2}}
	for i := range 2 {
		d, err := e.Runtime(ctx, "proj_memo", "", miner)
		if err != nil || !d.Kill || d.Rule != "crypto_miner" {
			t.Fatalf("decision %d on the miner: %+v %v; want the crypto_miner kill", i, d, err)
		}
	}
	if e.runtimeMemo.hits != 1 {
		t.Errorf("memo hits %d after the same input twice, want 1", e.runtimeMemo.hits)
	}
	d, err := e.Runtime(ctx, "proj_memo", "", map[string]any{"type": "exec", "argv": []any{"true"}, "session": map[string]any{"id": "sess_m", "tier": 2}})
	if err != nil || d.Kill || e.runtimeMemo.hits != 1 {
		t.Errorf("another input: %+v %v, memo hits %d; want it allowed and evaluated", d, err, e.runtimeMemo.hits)
	}
	long := map[string]any{"type": "exec", "argv": []any{"sh", "-c", strings.Repeat("x", memoKeyBytes)}}
	for range 2 {
		if _, err := e.Runtime(ctx, "proj_memo", "", long); err != nil {
			t.Fatal(err)
		}
	}
	if e.runtimeMemo.hits != 1 {
		t.Errorf("memo hits %d after an input longer than a key twice; want it evaluated every time", e.runtimeMemo.hits)
	}
	for i := range memoEntries + 10 {
		if _, err := e.Runtime(ctx, "proj_memo_bound", "", map[string]any{"type": "exec", "argv": []any{fmt.Sprint("cmd", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(e.runtimeMemo.docs); n > memoEntries {
		t.Errorf("the memo holds %d documents, want at most %d", n, memoEntries)
	}
	if got := len(decisions(t, e, "proj_memo")); got != 5 {
		t.Errorf("%d decisions logged, want all 5", got)
	}
}
