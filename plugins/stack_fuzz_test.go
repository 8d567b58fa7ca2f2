package plugins

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/tetratelabs/wazero"
)

// FuzzBoundStack: the rewrite that bounds a module's stack (boundStack, after the checks
// compile runs before it) never panics on a tenant's bytes, answers either a rewritten module
// or a ValidationError, and never turns a module wazero accepts into one it refuses: a
// mistake in the rewrite would fail a tenant's plugin at its first load, or, worse, hand
// wazero code the tenant did not write. A rewritten module that compiles exports the counter
// whenever the input had exports to add it to.
func FuzzBoundStack(f *testing.F) {
	for _, seed := range [][]byte{
		recursePlugin(3),
		wideRecursePlugin(4, 3),
		indirectRecursePlugin(),
		phiRecursePlugin(3, 2),
		simdRecursePlugin(2, 2, 2, 2, 3),
		simdPhiRecursePlugin(3, 2),
		loopParamPlugin(2, 2, 0, 3),
		loopParamPlugin(2, 1, 3, 3),
		constPlugin(`{"allow":true}`),
		spinPlugin(`{"allow":true}`, 3),
		tableGrowPlugin([]byte{0x70, 0, 1}, 1),
		initLogPlugin(2),
		memoryBomb(),
	} {
		f.Add(seed)
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	f.Cleanup(func() { _ = rt.Close(ctx) })
	compiles := func(wasm []byte) bool {
		cm, err := rt.CompileModule(ctx, wasm)
		if err != nil {
			return false
		}
		_ = cm.Close(ctx)
		return true
	}
	f.Fuzz(func(t *testing.T, wasm []byte) {
		if checkShape(wasm) != nil {
			return // compile refuses it before the rewrite
		}
		in, err := boundTables(wasm)
		if err != nil {
			return
		}
		out, err := boundStack(in)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("boundStack answered %T %v, want a ValidationError", err, err)
			}
			return
		}
		if !compiles(in) {
			return
		}
		if !compiles(out) {
			cm, err := rt.CompileModule(ctx, out)
			if cm != nil {
				_ = cm.Close(ctx)
			}
			t.Fatalf("a module wazero compiles was rewritten into one it refuses: %v", err)
		}
		if bytes.Contains(in, []byte("decide")) && !bytes.Contains(out, []byte(stackExport)) {
			t.Fatalf("the rewritten module does not export the stack's counter %q", stackExport)
		}
	})
}
