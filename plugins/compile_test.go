package plugins

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCompileSlotIsNotOneProjects: while one project's module compiles (for up to 18 s at
// the bounds: held here, as long as the test likes), another project's small module compiles
// at once, and the first project's next module waits for its own to end. (The host's one
// compile slot made every other project's upload and first load wait out the slow one.)
func TestCompileSlotIsNotOneProjects(t *testing.T) {
	h, _ := newTestHost(t, mini(t), Options{CacheDir: t.TempDir()})
	ctx := ctxT(t)
	if err := h.compiles.acquire(ctx, "proj-slow"); err != nil { // the slow compile, running
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			h.compiles.release("proj-slow")
		}
	}
	defer release()

	// The slow project's next upload waits for its running compile.
	slowNext := make(chan error, 1)
	go func() {
		_, err := h.Put(ctx, "proj-slow", "next", constPlugin(`{"allow":"slow-next"}`), []string{"admission"}, 0, false)
		slowNext <- err
	}()

	// Another project's small module: a wide margin, far more than its compile takes.
	other, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := h.Put(other, "proj-other", "small", constPlugin(`{"allow":"other"}`), []string{"admission"}, 0, false); err != nil {
		t.Fatalf("another project's upload while one project compiles: %v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("another project's upload took %v while one project's compile ran", time.Since(start).Round(time.Millisecond))

	select {
	case err := <-slowNext:
		t.Fatalf("the slow project's second upload ended (%v) while its first compile ran", err)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	if err := <-slowNext; err != nil {
		t.Fatalf("the slow project's second upload, once its first compile ended: %v", err)
	}
}

// TestCompileWaitEndsWithItsContext: a caller whose context ends while it waits for a compile
// slot fails with its context's error and leaves the slots as they were.
func TestCompileWaitEndsWithItsContext(t *testing.T) {
	h, _ := newTestHost(t, nil, Options{CacheDir: t.TempDir()})
	ctx := ctxT(t)
	release := holdCompiles(t, h)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := h.compiles.acquire(short, "proj-x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait while every slot is taken: %v, want its deadline", err)
	}
	release()
	for range maxCompiles {
		if err := h.compiles.acquire(ctx, ""); err != nil {
			t.Fatal(err)
		}
		h.compiles.release("")
	}
}

// holdCompiles takes every compile slot of h (one per project), as compiles of as many
// projects would, until the function it answers is called.
func holdCompiles(t *testing.T, h *Host) func() {
	t.Helper()
	var held []string
	for i := range maxCompiles {
		p := "proj-holding-" + string(rune('a'+i))
		if err := h.compiles.acquire(ctxT(t), p); err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	done := false
	release := func() {
		if !done {
			done = true
			for _, p := range held {
				h.compiles.release(p)
			}
		}
	}
	t.Cleanup(release)
	return release
}

// TestSlowJoinsRefusedBeforeCompile: a function setting many locals across many blocks (a
// 7 KiB function took 3.8 s to compile, and a module may hold thousands) is refused before any
// compile, naming the bound, and so is a module of many functions each within it whose joins
// weigh past the module's bound (a function's compile time grows with the square of its joins
// past a few thousand: 42 functions of 9,800, 411,600 joins, compiled in 12 s, and 200 of them
// would have taken a minute), and so are functions whose joins are values passed into blocks
// (60 loops of 1,000 parameters compiled in 10 s, one loop of 1,000 branched to by a
// br_table of 1,000 labels in 2 s): the test holds every compile slot, so a compile would
// wait out the call's context.
func TestSlowJoinsRefusedBeforeCompile(t *testing.T) {
	h, _ := newTestHost(t, nil, Options{CacheDir: t.TempDir()})
	holdCompiles(t, h)
	ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
	defer cancel()
	_, err := h.Validate(ctx, phiRecursePlugin(200, 200))
	if want := "function 2 has 40401 joins (200 locals set across 202 blocks, and block parameters, results and values branched with: 1), more than the 10000 joins a function may have: split it"; !isInvalid(err, want) {
		t.Fatalf("got %v, want a refusal saying %q, before any compile", err, want)
	}
	// Values where paths join that are no local: 60 loops of 1,000 parameters (a 7 KiB
	// module compiled in about 10 s), and one loop of 1,000 parameters branched to by a
	// br_table of 1,000 labels (each label passes the 1,000 values: 2 s).
	for _, c := range []struct {
		wasm []byte
		want string
	}{
		{loopParamPlugin(1000, 60, 0, 20), "function 2 has 120001 joins (0 locals set across 62 blocks, and block parameters, results and values branched with: 120001), more than the 10000 joins a function may have: split it"},
		{loopParamPlugin(1000, 1, 1000, 20), "function 2 has 1001001 joins (0 locals set across 3 blocks, and block parameters, results and values branched with: 1001001), more than the 10000 joins a function may have: split it"},
	} {
		if _, err := h.Validate(ctx, c.wasm); !isInvalid(err, c.want) {
			t.Fatalf("got %v, want a refusal saying %q, before any compile", err, c.want)
		}
	}
	// phiRecursePlugin's f, 42 times: 98 locals set across 100 blocks each.
	m := wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1))}}
	var fs []wfunc
	for range 42 {
		fs = append(fs, wfunc{params: []byte{tI32}, results: []byte{tI32}, locals: 98, body: phiBody(98, 98)})
	}
	m.funcs = append(m.funcs, fs...)
	_, err = h.Validate(ctx, m.encode())
	if want := "its functions set locals across blocks and pass values to blocks (joins, weighed by their square past 2000 a function) 2017218 times or more, more than the 2000000 a plugin's functions may have together"; !isInvalid(err, want) {
		t.Fatalf("got %v, want a refusal saying %q, before any compile", err, want)
	}
}
