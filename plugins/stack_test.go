package plugins

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

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
	return wmod{memMin: 1, memMax: -1,
		funcs: []wfunc{allocFunc(), decideFunc(cat(i32c(1<<20), []byte{opCall, 2, opDrop}, resultAt0(len(out)))),
			{params: []byte{tI32}, results: []byte{tI32}, locals: l, body: b}},
		data: []wdata{{0, []byte(out)}}}.encode()
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
		{"values where paths join", phiRecursePlugin(100, 98)},
		{"results of calls", multiValuePlugin(50, 1000)},
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
