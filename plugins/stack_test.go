package plugins

import (
	"bytes"
	"context"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"wb/session"
)

// wideRecursePlugin: like recursePlugin, but each frame of f keeps n values loaded from memory
// live across its recursive call (so they are spilled to its frame: n×8 bytes or more), then
// adds them up.
func wideRecursePlugin(n int, depth int32) []byte {
	out := `{"allow":true}`
	var loads, adds []byte
	for k := range n {
		loads = append(loads, i32c(int32(4*(k%1000)))...)
		loads = append(loads, 0x28, 2, 0) // i32.load align=4 offset=0
		adds = append(adds, 0x6a)         // i32.add
	}
	f := cat(
		[]byte{opLocalGet, 0, opI32Eqz},
		[]byte{opIf, tI32}, i32c(0),
		[]byte{0x05}, // else
		loads,
		[]byte{opLocalGet, 0}, i32c(1), []byte{opI32Sub, opCall, 2},
		adds,
		[]byte{opEnd})
	return wmod{memMin: 1, memMax: -1,
		funcs: []wfunc{allocFunc(), decideFunc(cat(i32c(depth), []byte{opCall, 2, opDrop}, resultAt0(len(out)))),
			{params: []byte{tI32}, results: []byte{tI32}, body: f}},
		data: []wdata{{0, []byte(out)}}}.encode()
}

// indirectRecursePlugin: decide calls f, which calls itself through a table (call_indirect),
// without end.
func indirectRecursePlugin() []byte {
	out := `{"allow":true}`
	typ := func(params, results []byte) []byte {
		return cat([]byte{0x60}, vec(bytesEach(params)...), vec(bytesEach(results)...))
	}
	body := func(b ...[]byte) []byte {
		c := cat(vec(), cat(b...), []byte{opEnd})
		return cat(uleb(uint64(len(c))), c)
	}
	return cat([]byte("\x00asm\x01\x00\x00\x00"),
		section(1, vec(typ([]byte{tI32}, []byte{tI32}), typ([]byte{tI32, tI32}, []byte{tI64}))),
		section(3, vec([]byte{0}, []byte{1}, []byte{0})),
		section(4, vec([]byte{0x70, 0, 1})),
		section(5, vec([]byte{0, 1})),
		section(7, vec(cat(wstr("memory"), []byte{2, 0}), cat(wstr("alloc"), []byte{0, 0}), cat(wstr("decide"), []byte{0, 1}))),
		section(9, vec(cat([]byte{0}, i32c(0), []byte{opEnd}, vec([]byte{2})))),
		section(10, vec(
			body(i32c(inputAt)),
			body(i32c(5), []byte{opCall, 2, opDrop}, resultAt0(len(out))),
			body([]byte{opLocalGet, 0}, i32c(1), []byte{opI32Sub}, i32c(0), []byte{0x11, 0, 0}))),
		section(11, vec(cat([]byte{0}, i32c(0), []byte{opEnd}, wstr(out)))))
}

// phiRecursePlugin: f(n) has l locals and d nested loops, each with a back edge on a loaded
// condition and a call; the innermost loop sets every local and recurses, so that at each
// loop's head every local is a value of its own, live across the calls (spilled to the frame:
// l×d values from a few bytes of code each).
func phiRecursePlugin(l, d int) []byte {
	out := `{"allow":true}`
	return wmod{memMin: 1, memMax: -1,
		funcs: []wfunc{allocFunc(), decideFunc(cat(i32c(1<<20), []byte{opCall, 2, opDrop}, resultAt0(len(out)))),
			{params: []byte{tI32}, results: []byte{tI32}, locals: l, body: phiBody(l, d)}},
		data: []wdata{{0, []byte(out)}}}.encode()
}

// phiBody is phiRecursePlugin's f (function 2, with l i32 locals): l locals set across d+2
// blocks, l×(d+2) joins.
func phiBody(l, d int) []byte {
	var b []byte
	b = append(b, opLocalGet, 0, opI32Eqz, opIf, tI32)
	b = append(b, i32c(0)...)
	b = append(b, 0x05)
	for range d {
		b = append(b, opLoop, blockEmpty)
	}
	for i := 1; i <= l; i++ {
		b = append(b, opLocalGet)
		b = append(b, uleb(uint64(i))...)
		b = append(b, 0x28, 2, 0) // i32.load (address = local value)
		b = append(b, opLocalSet)
		b = append(b, uleb(uint64(i))...)
	}
	b = append(b, opLocalGet, 0)
	b = append(b, i32c(1)...)
	b = append(b, opI32Sub, opCall, 2, opDrop)
	for range d {
		// A call in each loop, then its back edge on a loaded condition.
		b = append(b, i32c(0)...)
		b = append(b, opCall, 2, opDrop)
		b = append(b, i32c(8)...)
		b = append(b, 0x28, 2, 0)
		b = append(b, opBrIf, 0, opEnd)
		for i := 1; i <= l; i += 50 {
			b = append(b, opLocalGet)
			b = append(b, uleb(uint64(i))...)
			b = append(b, opDrop)
		}
	}
	b = append(b, i32c(0)...)
	b = append(b, opEnd)
	return b
}

// multiValuePlugin: g(n) calls f k times (each pushing nres values from 2 bytes of code),
// recurses, then hands the values to sink: k*nres values live across the recursive call.
func multiValuePlugin(k, nres int) []byte {
	out := `{"allow":true}`
	fbody := cat(i32c(0), []byte{0x28, 2, 0, opLocalSet, 0}, bytes.Repeat([]byte{opLocalGet, 0}, nres))
	var g []byte
	g = append(g, opLocalGet, 0, opI32Eqz, opIf, tI32)
	g = append(g, i32c(0)...)
	g = append(g, 0x05)
	g = append(g, bytes.Repeat([]byte{opCall, 3}, k)...)
	g = append(g, opLocalGet, 0)
	g = append(g, i32c(1)...)
	g = append(g, opI32Sub, opCall, 2, opDrop)
	g = append(g, bytes.Repeat([]byte{opCall, 4}, k)...)
	g = append(g, i32c(0)...)
	g = append(g, opEnd)
	return wmod{memMin: 1, memMax: -1,
		funcs: []wfunc{allocFunc(), decideFunc(cat(i32c(1<<20), []byte{opCall, 2, opDrop}, resultAt0(len(out)))),
			{params: []byte{tI32}, results: []byte{tI32}, body: g},
			{results: bytes.Repeat([]byte{tI32}, nres), locals: 1, body: fbody},
			{params: bytes.Repeat([]byte{tI32}, nres)}},
		data: []wdata{{0, []byte(out)}}}.encode()
}

// loopParamPlugin: f(n) (function 2) pushes k v128 values and enters d nested loops, each
// of the block type (v128×k) -> () (a type index): every loop's head has k parameters,
// values of their own that take no code byte and set no local. The innermost loop recurses
// (f(n-1)), takes k fresh values from g (function 3) and branches back to each of the d loops
// with them when a zero in memory is not zero (never, but the compiler cannot know), or, with
// labels > 0, to the innermost loop with a br_table of that many labels, each passing the k
// values; then returns. decide calls f at depth, or with depth 0 at its first argument.
func loopParamPlugin(k, d, labels int, depth int32) []byte {
	out := `{"allow":true}`
	v := bytes.Repeat([]byte{tV128}, k)
	ft := func(p, r []byte) []byte { return cat([]byte{0x60}, vec(bytesEach(p)...), vec(bytesEach(r)...)) }
	types := [][]byte{
		ft([]byte{tI32}, []byte{tI32}),       // 0: alloc, f
		ft([]byte{tI32, tI32}, []byte{tI64}), // 1: decide
		ft(nil, v),                           // 2: g
		ft(v, nil),                           // 3: the loops' block type
	}
	var f []byte
	f = append(f, opLocalGet, 0, opI32Eqz, opIf, tI32)
	f = append(f, i32c(0)...)
	f = append(f, 0x05) // else
	for range k {
		f = append(f, opLocalGet, 1)
	}
	for range d {
		f = append(f, opLoop, 3) // block type: type 3
	}
	f = append(f, opLocalGet, 0)
	f = append(f, i32c(1)...)
	f = append(f, opI32Sub, opCall, 2, opDrop) // f(n-1)
	f = append(f, opCall, 3)                   // k fresh values
	if labels > 0 {
		f = append(f, i32c(100)...)
		f = append(f, 0x28, 2, 0, 0x0e) // i32.load: 0; br_table
		f = append(f, uleb(uint64(labels-1))...)
		f = append(f, make([]byte, labels)...)
	} else {
		for j := range d {
			f = append(f, i32c(100)...)
			f = append(f, 0x28, 2, 0, opBrIf) // i32.load: 0
			f = append(f, uleb(uint64(j))...)
		}
		f = append(f, i32c(0)...)
		f = append(f, 0x0f) // return
	}
	for range d {
		f = append(f, opEnd)
	}
	f = append(f, i32c(0)...)
	f = append(f, opEnd) // if
	g := bytes.Repeat([]byte{opLocalGet, 0}, k)
	body := func(locals []byte, code []byte) []byte {
		b := cat(locals, code, []byte{opEnd})
		return cat(uleb(uint64(len(b))), b)
	}
	oneLocal := func(t byte) []byte { return vec([]byte{1, t}) }
	at := i32c(depth)
	if depth == 0 {
		at = []byte{opLocalGet, 0}
	}
	return cat([]byte("\x00asm\x01\x00\x00\x00"),
		section(1, vec(types...)),
		section(3, vec([]byte{0}, []byte{1}, []byte{0}, []byte{2})),
		section(5, vec([]byte{0, 1})),
		section(7, vec(cat(wstr("alloc"), []byte{0, 0}), cat(wstr("decide"), []byte{0, 1}), cat(wstr("memory"), []byte{2, 0}))),
		section(10, vec(
			body(vec(), i32c(inputAt)),
			body(oneLocal(tI32), cat(at, []byte{opCall, 2, opDrop}, resultAt0(len(out)))),
			body(oneLocal(tV128), f),
			body(oneLocal(tV128), g))),
		section(11, vec(cat([]byte{0}, i32c(0), []byte{opEnd}, wstr(out)))))
}

// allocated answers the bytes the host's heap allocated while f ran.
func allocated(f func()) uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	f()
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc - before
}

// TestStackIsCapped: a plugin whose calls nest deeper than its stack allows (a deep recursion
// of small frames, or a shallower one of large frames) fails with a deny naming the stack
// limit, and the host's heap, which holds wazero's call stack outside the memory cap, grows
// by a few MiB at most (wazero's own ceiling let a call grow it by about 100 MiB, and
// allocate twice that on the way).
func TestStackIsCapped(t *testing.T) {
	h, _ := newTestHost(t, mini(t), Options{Timeout: MaxTimeout})
	in := admission(t, session.CreateRequest{Tier: intp(1), Template: "x"})
	for _, c := range []struct {
		name string
		wasm []byte
	}{
		{"deep", recursePlugin(1 << 24)},
		{"wide frames", wideRecursePlugin(4000, 1<<20)},
		{"through a table", indirectRecursePlugin()},
		{"values where paths join", phiRecursePlugin(100, 97)},
		{"results of calls", multiValuePlugin(50, 1000)},
		{"v128 parameters", simdRecursePlugin(1000, 0, 0, 1, 1<<20)},
		{"v128 locals", simdRecursePlugin(1, 2000, 0, 1, 1<<20)},
		{"v128 values", simdRecursePlugin(1, 0, 2000, 1, 1<<20)},
		{"v128 results", simdRecursePlugin(1, 0, 0, 1000, 1<<20)},
		{"v128 values where paths join", simdPhiRecursePlugin(100, 97)},
		{"v128 loop parameters", loopParamPlugin(100, 40, 0, 1<<20)},
	} {
		t.Run(c.name, func(t *testing.T) {
			project := "proj-stack-" + strings.ReplaceAll(c.name, " ", "-")
			mustPut(t, h, project, "deep", c.wasm, 0, false)
			var d session.Decision
			grew := allocated(func() { d = one(t, decide(t, h, project, in)) })
			t.Logf("decision %+v; the heap allocated %d MiB", d, grew>>20)
			if want := "plugin deep: exceeded its stack limit of"; d.Allow || len(d.Reasons) != 1 || !strings.HasPrefix(d.Reasons[0], want) {
				t.Errorf("decision: %+v, want a deny beginning %q", d, want)
			}
			if grew > 2*MaxStackBytes {
				t.Errorf("one call of a deep recursion allocated %d MiB in the host's heap, want at most %d", grew>>20, 2*MaxStackBytes>>20)
			}
		})
	}
}

// TestStackCountIsTheHosts: code that uses a global or a local the module does not define is
// refused: the ones the host adds to count the stack would answer to it, and a module that
// set the count back could recurse without bound.
func TestStackCountIsTheHosts(t *testing.T) {
	h, _ := newTestHost(t, nil, Options{})
	ctx := ctxT(t)
	for _, c := range []struct {
		name string
		wasm []byte
		want string
	}{
		{"global", rawPlugin(`{"allow":true}`, cat(i32c(0), []byte{0x24, 0}, resultAt0(14))), "function 1: uses the global 0, and the module has 0"},
		{"local", rawPlugin(`{"allow":true}`, cat(i32c(0), []byte{opLocalSet, 3}, resultAt0(14))), "function 1: uses the local 3, and it has 3"},
		{"export", wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1)), {name: "wb.start"}}}.encode(), `exports "wb.start"`},
		{"the deep flag's export", wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1)), {name: "wb.deep"}}}.encode(), `exports "wb.deep"`},
	} {
		if _, err := h.Validate(ctx, c.wasm); !isInvalid(err, c.want) {
			t.Errorf("%s: %v, want a refusal saying %q", c.name, err, c.want)
		}
	}
}

// TestStackIsCappedInStart: the stack's bound holds in a module's start section (which the
// host calls itself, as startExport) and its _initialize, and a start that keeps within it runs.
func TestStackIsCappedInStart(t *testing.T) {
	h, _ := newTestHost(t, nil, Options{})
	ctx := ctxT(t)
	// Function 2 is recursePlugin's f(n); the start section names function 3, which calls it
	// at a depth.
	withStart := func(depth int32) []byte {
		start := wfunc{body: cat(i32c(depth), []byte{opCall, 2, opDrop})}
		wm := wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(14)),
			{params: []byte{tI32}, results: []byte{tI32}, body: cat(
				[]byte{opLocalGet, 0, opI32Eqz},
				[]byte{opIf, tI32}, i32c(0),
				[]byte{0x05},
				[]byte{opLocalGet, 0}, i32c(1), []byte{opI32Sub, opCall, 2}, i32c(1), []byte{0x6a},
				[]byte{opEnd})}, start},
			data: []wdata{{0, []byte(`{"allow":true}`)}}}
		m := wm.encode()
		// The start section (8) goes after the exports (7), before the code (10).
		_, _, end, err := sectionAt(m, 7)
		if err != nil {
			t.Fatal(err)
		}
		return cat(m[:end], section(8, uleb(3)), m[end:])
	}
	if _, err := h.Validate(ctx, withStart(1<<24)); !isInvalid(err, "does not start: failed to start: exceeded its stack limit of 8 MiB") {
		t.Errorf("a start section recursing without end: %v", err)
	}
	if _, err := h.Validate(ctx, withStart(100)); err != nil {
		t.Errorf("a start section within the bound: %v", err)
	}
	if _, err := h.Validate(ctx, wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(14)),
		{name: "_initialize", body: cat(i32c(1<<24), []byte{opCall, 3, opDrop})},
		{params: []byte{tI32}, results: []byte{tI32}, body: cat([]byte{opLocalGet, 0}, []byte{opCall, 3})}}}.encode()); !isInvalid(err, "does not start: failed to start: exceeded its stack limit") {
		t.Errorf("an _initialize recursing without end: %v", err)
	}
}

// TestStackRewriteReadsLongCounts: the same module twice, its decide's count of local groups
// encoded minimally (01) and not (81 00, valid LEB128 that wazero reads), is valid both ways:
// the rewrite copied the declarations from the minimal encoding's length, and turned the
// second into a module wazero refused.
func TestStackRewriteReadsLongCounts(t *testing.T) {
	out := `{"allow":true}`
	typ := func(params, results []byte) []byte {
		return cat([]byte{0x60}, vec(bytesEach(params)...), vec(bytesEach(results)...))
	}
	mod := func(groups []byte) []byte {
		sized := func(c []byte) []byte { return cat(uleb(uint64(len(c))), c) }
		alloc := sized(cat([]byte{0}, i32c(inputAt), []byte{opEnd}))
		dec := sized(cat(groups, []byte{1, tI32}, resultAt0(len(out)), []byte{opEnd}))
		return cat([]byte("\x00asm\x01\x00\x00\x00"),
			section(1, vec(typ([]byte{tI32}, []byte{tI32}), typ([]byte{tI32, tI32}, []byte{tI64}))),
			section(3, vec([]byte{0}, []byte{1})),
			section(5, vec([]byte{0, 1})),
			section(7, vec(cat(wstr("memory"), []byte{2, 0}), cat(wstr("alloc"), []byte{0, 0}), cat(wstr("decide"), []byte{0, 1}))),
			section(10, vec(alloc, dec)),
			section(11, vec(cat([]byte{0}, i32c(0), []byte{opEnd}, wstr(out)))))
	}
	h, _ := newTestHost(t, nil, Options{})
	for _, g := range [][]byte{{0x01}, {0x81, 0x00}} {
		if _, err := h.Validate(ctxT(t), mod(g)); err != nil {
			t.Errorf("groups encoded % x: %v", g, err)
		}
	}
}

// SIMD instructions the stack tests use (0xfd prefix; v128 values are 16 bytes).
var (
	v128Load = []byte{0xfd, 0x00}       // v128.load memarg
	i32x4Add = []byte{0xfd, 0xae, 0x01} // i32x4.add
)

// v128LoadAt loads the 16 bytes at offset (from address 0).
func v128LoadAt(offset int) []byte {
	return cat(i32c(0), v128Load, []byte{4}, uleb(uint64(offset))) // align 16
}

// simdRecursePlugin: f(n, k v128 parameters) has l v128 locals and answers r v128 results; a
// frame loads l locals and m more v128 values from memory, passes its k parameters on to its
// recursive call, and adds everything up (all of it live across the call, so spilled to its
// frame, 16 bytes a value) into its r results. decide calls f at depth.
func simdRecursePlugin(k, l, m, r int, depth int32) []byte {
	out := `{"allow":true}`
	var b []byte
	b = append(b, opLocalGet, 0, opI32Eqz, opIf, blockEmpty)
	for range r {
		b = append(b, opLocalGet, 1)
	}
	b = append(b, 0x0f, opEnd) // return
	for i := range l {
		b = append(b, v128LoadAt(16*(i%4000))...)
		b = append(b, opLocalSet)
		b = append(b, uleb(uint64(1+k+i))...)
	}
	for i := range m {
		b = append(b, v128LoadAt(16*((l+i)%4000))...)
	}
	b = append(b, opLocalGet, 0)
	b = append(b, i32c(1)...)
	b = append(b, opI32Sub)
	for i := range k {
		b = append(b, opLocalGet)
		b = append(b, uleb(uint64(1+i))...)
	}
	b = append(b, opCall, 2)
	for range r - 1 + m {
		b = append(b, i32x4Add...)
	}
	for i := 1; i < 1+k+l; i++ {
		b = append(b, opLocalGet)
		b = append(b, uleb(uint64(i))...)
		b = append(b, i32x4Add...)
	}
	b = append(b, opLocalTee, 1)
	for range r - 1 {
		b = append(b, opLocalGet, 1)
	}
	var d []byte
	d = append(d, i32c(depth)...)
	for range k {
		d = append(d, 0xfd, 0x0c) // v128.const 0
		d = append(d, make([]byte, 16)...)
	}
	d = append(d, opCall, 2)
	d = append(d, bytes.Repeat([]byte{opDrop}, r)...)
	d = append(d, resultAt0(len(out))...)
	return wmod{memMin: 1, memMax: -1,
		funcs: []wfunc{allocFunc(), decideFunc(d),
			{params: cat([]byte{tI32}, bytes.Repeat([]byte{tV128}, k)), results: bytes.Repeat([]byte{tV128}, r),
				locals: l, localType: tV128, body: b}},
		data: []wdata{{0, []byte(out)}}}.encode()
}

// simdPhiRecursePlugin: phiRecursePlugin's shape with v128 locals: f(n) has l v128 locals
// and d nested loops, each with a call and a back edge; the innermost sets every local (a
// load from the address in its first lane) and recurses, so that at each loop's head every
// local is a v128 value of its own, live across the calls.
func simdPhiRecursePlugin(l, d int) []byte {
	out := `{"allow":true}`
	var b []byte
	b = append(b, opLocalGet, 0, opI32Eqz, opIf, tI32)
	b = append(b, i32c(0)...)
	b = append(b, 0x05)
	for range d {
		b = append(b, opLoop, blockEmpty)
	}
	for i := 1; i <= l; i++ {
		b = append(b, opLocalGet)
		b = append(b, uleb(uint64(i))...)
		b = append(b, 0xfd, 27, 0) // i32x4.extract_lane 0
		b = append(b, v128Load...)
		b = append(b, 4, 0)
		b = append(b, opLocalSet)
		b = append(b, uleb(uint64(i))...)
	}
	b = append(b, opLocalGet, 0)
	b = append(b, i32c(1)...)
	b = append(b, opI32Sub, opCall, 2, opDrop)
	for range d {
		b = append(b, i32c(0)...)
		b = append(b, opCall, 2, opDrop)
		b = append(b, i32c(8)...)
		b = append(b, 0x28, 2, 0)
		b = append(b, opBrIf, 0, opEnd)
		for i := 1; i <= l; i += 50 {
			b = append(b, opLocalGet)
			b = append(b, uleb(uint64(i))...)
			b = append(b, opDrop)
		}
	}
	b = append(b, i32c(0)...)
	b = append(b, opEnd)
	// f's locals: i32 n is its parameter; the l v128 locals follow.
	return wmod{memMin: 1, memMax: -1,
		funcs: []wfunc{allocFunc(), decideFunc(cat(i32c(1<<20), []byte{opCall, 2, opDrop}, resultAt0(len(out)))),
			{params: []byte{tI32}, results: []byte{tI32}, locals: l, localType: tV128, body: b}},
		data: []wdata{{0, []byte(out)}}}.encode()
}

// TestStackCountBoundsWazerosStack: for each shape of frame, SIMD's included (v128
// parameters, locals, values, results, values where paths join and loops' parameters, 16
// bytes each), the stack wazero's compiled code used when the count reached MaxStackBytes is
// under the count: frameCost is an upper bound of the frames wazero makes. The stack used is
// read from the grown stack wazero keeps on the function (its lowest byte written: the stack
// grows down from the top and starts zeroed), an unexported field: the test fails if a new
// wazero names it otherwise, and its frames must then be measured again.
func TestStackCountBoundsWazerosStack(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skipf("wazero compiles no code on %s", runtime.GOARCH)
	}
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { _ = rt.Close(ctx) })
	for _, c := range []struct {
		name string
		wasm []byte
	}{
		{"deep", recursePlugin(1 << 24)},
		{"wide frames", wideRecursePlugin(4000, 1<<20)},
		{"values where paths join", phiRecursePlugin(100, 97)},
		{"results of calls", multiValuePlugin(50, 1000)},
		{"v128 parameters", simdRecursePlugin(1000, 0, 0, 1, 1<<20)},
		{"v128 parameters in registers", simdRecursePlugin(8, 0, 0, 1, 1<<20)},
		{"v128 locals", simdRecursePlugin(1, 2000, 0, 1, 1<<20)},
		{"v128 values", simdRecursePlugin(1, 0, 2000, 1, 1<<20)},
		{"v128 results", simdRecursePlugin(1, 0, 0, 1000, 1<<20)},
		{"v128 results in registers", simdRecursePlugin(1, 0, 0, 8, 1<<20)},
		{"v128 all", simdRecursePlugin(100, 100, 100, 100, 1<<20)},
		{"v128 small", simdRecursePlugin(2, 2, 2, 2, 1<<20)},
		{"v128 values where paths join", simdPhiRecursePlugin(100, 97)},
		{"v128 loop parameters", loopParamPlugin(100, 40, 0, 1<<20)},
		{"v128 loop parameters through a br_table", loopParamPlugin(100, 1, 50, 1<<20)},
	} {
		t.Run(c.name, func(t *testing.T) {
			wasm, err := boundStack(c.wasm)
			if err != nil {
				t.Fatal(err)
			}
			mod, err := rt.Instantiate(ctx, wasm)
			if err != nil {
				t.Fatal(err)
			}
			defer mod.Close(ctx)
			decide := mod.ExportedFunction("decide")
			if _, err := decide.Call(ctx, 0, 0); err == nil || !strings.Contains(err.Error(), "unreachable") {
				t.Fatalf("decide: %v, want the stack bound's trap", err)
			}
			count := uint64(uint32(mod.ExportedGlobal(stackExport).Get()))
			stack := stackOf(t, decide)
			used := 0
			for i := range stack.Len() {
				if stack.Index(i).Uint() != 0 {
					used = stack.Len() - i
					break
				}
			}
			t.Logf("counted %d KiB, used %d KiB (%.2f of the count)", count>>10, used>>10, float64(used)/float64(count))
			if used == 0 || uint64(used) > count {
				t.Errorf("wazero's code used %d bytes of stack where the count was %d: frameCost undercounts", used, count)
			}
		})
	}
}

// TestUnflaggedCallsGrowLittleStack: a call whose count stays under keptStackBytes (the deep
// flag unset, so that the pooled instance keeps its functions and the stack they grew) grows
// wazero's stack to at most twice keptStackBytes (it doubles as it grows), here for frames
// whose values are loop parameters, at every depth up to the flag's: their parameters were
// not counted, and a call at depth 20 of frames of 60 loops of 1,000 parameters grew 29 MiB
// of stack, kept by each pooled instance.
func TestUnflaggedCallsGrowLittleStack(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skipf("wazero compiles no code on %s", runtime.GOARCH)
	}
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { _ = rt.Close(ctx) })
	wasm, err := boundStack(loopParamPlugin(100, 40, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	for depth := uint64(1); ; depth += depth/4 + 1 {
		// A fresh instance each time: its functions have grown no stack yet.
		mod, err := rt.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithName(""))
		if err != nil {
			t.Fatal(err)
		}
		decide := mod.ExportedFunction("decide")
		_, err = decide.Call(ctx, depth, 0)
		deep := mod.ExportedGlobal(deepExport).Get() != 0
		n := stackOf(t, decide).Len()
		_ = mod.Close(ctx)
		if err != nil {
			t.Fatalf("depth %d: %v", depth, err)
		}
		if deep {
			t.Logf("the deep flag is set from depth %d on (wazero's stack: %d KiB)", depth, n>>10)
			break
		}
		if n > 2*keptStackBytes {
			t.Fatalf("a call at depth %d left the deep flag unset and grew wazero's stack to %d KiB, more than %d KiB: the pooled instance keeps it",
				depth, n>>10, 2*keptStackBytes>>10)
		}
	}
}

// deepestAllowed answers the deepest depth at which build's plugin's decide runs within the
// stack's bound (a search, running the rewritten module in a runtime of its own).
func deepestAllowed(t *testing.T, build func(depth int32) []byte) int32 {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	runs := func(depth int32) bool {
		wasm, err := boundStack(build(depth))
		if err != nil {
			t.Fatal(err)
		}
		mod, err := rt.Instantiate(ctx, wasm)
		if err != nil {
			t.Fatal(err)
		}
		defer mod.Close(ctx)
		_, err = mod.ExportedFunction("decide").Call(ctx, 0, 0)
		return err == nil
	}
	lo, hi := int32(1), int32(1<<20) // runs(lo), !runs(hi)
	if !runs(lo) || runs(hi) {
		t.Fatalf("the plugin runs at depth 1: %v, at %d: %v", runs(lo), hi, runs(hi))
	}
	for hi-lo > 1 {
		if mid := lo + (hi-lo)/2; runs(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// TestDeepStackIsNotKept: decisions whose calls nest as deep as the stack's bound allows, on
// every instance of a pool at once, leave the host's heap no larger once they are done, and
// the pooled instances' functions keep no grown stack: wazero keeps the stack it grew on the
// function for its next call, and the instance took fresh functions after a call past
// keptStackBytes only when it took a millisecond or more, so that a quick deep call (a
// recursion of small frames: about 300 KiB of stack, each instance's kept) left its stack on
// the pooled instance, on a machine quick enough for any depth up to twice MaxStackBytes.
func TestDeepStackIsNotKept(t *testing.T) {
	const size = 4
	h, _ := newTestHost(t, mini(t), Options{Timeout: MaxTimeout, PoolSize: size})
	in := admission(t, session.CreateRequest{Tier: intp(1), Template: "x"})
	for _, c := range []struct {
		name  string
		build func(depth int32) []byte
	}{
		{"small frames", recursePlugin},
		{"large frames", func(depth int32) []byte { return simdRecursePlugin(1, 0, 0, 1000, depth) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			project := "proj-kept-" + strings.ReplaceAll(c.name, " ", "-")
			depth := deepestAllowed(t, c.build)
			mustPut(t, h, project, "deep", c.build(depth), 0, false)
			one(t, decide(t, h, project, in)) // the project's plugin set loaded
			_, base := measure()
			for range 5 {
				var wg sync.WaitGroup
				for range size {
					wg.Go(func() {
						ds, err := h.Decide(context.Background(), project, session.PointAdmission, in)
						if err != nil || len(ds) != 1 || !ds[0].Allow {
							t.Errorf("decision at depth %d: %+v, %v", depth, ds, err)
						}
					})
				}
				wg.Wait()
			}
			_, after := measure()
			kept := int64(after) - int64(base)
			t.Logf("depth %d; the heap kept %d KiB after the decisions", depth, kept>>10)
			if kept > 2<<20 {
				t.Errorf("decisions at the stack's bound left the host's heap %d MiB larger (their call stacks, kept by the pooled instances)", kept>>20)
			}
			instances := 0
			for _, p := range poolsOf(t, h, project) {
				p.mu.Lock()
				for _, inst := range p.idle {
					instances++
					for name, f := range map[string]api.Function{"alloc": inst.alloc, "decide": inst.decide} {
						if n := stackOf(t, f).Len(); n > 64<<10 {
							t.Errorf("a pooled instance's %s keeps a stack of %d KiB", name, n>>10)
						}
					}
				}
				p.mu.Unlock()
			}
			if instances == 0 {
				t.Error("no pooled instance")
			}
		})
	}
}

// stackOf answers the stack wazero keeps on a function of compiled code (an unexported
// field: the test fails if a new wazero names it otherwise).
func stackOf(t *testing.T, f api.Function) reflect.Value {
	t.Helper()
	v := reflect.ValueOf(f)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	var stack reflect.Value
	if v.Kind() == reflect.Struct {
		stack = v.FieldByName("stack")
	}
	if !stack.IsValid() || stack.Kind() != reflect.Slice || stack.Type().Elem().Kind() != reflect.Uint8 {
		t.Fatalf("wazero's %T has no stack []byte: measure its stack another way", f)
	}
	return stack
}

// poolsOf answers the pools of the project's loaded plugin set.
func poolsOf(t *testing.T, h *Host, project string) []*pool {
	t.Helper()
	h.mu.Lock()
	pr := h.projects[project]
	h.mu.Unlock()
	if pr == nil || pr.snap.Load() == nil {
		t.Fatalf("project %s has no plugin set loaded", project)
	}
	var out []*pool
	for _, p := range pr.snap.Load().pools {
		out = append(out, p)
	}
	return out
}
