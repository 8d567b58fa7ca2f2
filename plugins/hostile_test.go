package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/internal/logbudget"
	"wb/session"
)

// memoryBomb grows memory 3 pages at a time (to exactly 64 or 256) until memory.grow fails, then traps.
func memoryBomb() []byte {
	body := cat(
		[]byte{opLoop, blockEmpty},
		i32c(3), []byte{opMemoryGrow, 0},
		i32c(-1), []byte{opI32Eq, opIf, blockEmpty, opUnreachable, opEnd},
		[]byte{opBr, 0},
		[]byte{opEnd},
		i64c(0),
	)
	return rawPlugin(`{"allow":true}`, body)
}

// bigGrow asks for more than the limit at once and answers whatever memory.grow said.
func bigGrow() []byte {
	body := cat(i32c(10_000), []byte{opMemoryGrow, 0}, i32c(-1), []byte{opI32Eq, opIf, blockEmpty, opUnreachable, opEnd}, resultAt0(14))
	return rawPlugin(`{"allow":true}`, body)
}

// TestHostile: each misbehaving plugin gets a clear deny (or, fail-open, an allow with a
// warning), and the host keeps serving a good plugin correctly after each.
func TestHostile(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{Timeout: DefaultTimeout})
	const good = "proj-good"
	mustPut(t, h, good, "allowlist", guests["allowlist"], 0, false)
	// Generous limits where a timeout is not the point: the machine may be loaded. The
	// memory bombs get 4 MiB (the Go guest 8, as its heap grows 4 MiB at a time), not the
	// default 16: under -race each grow's copy is slow enough that a loaded machine took
	// past the 10 s most to fill 16 MiB.
	roomy := func(project string, pages uint32) {
		t.Helper()
		if err := h.SetLimits(ctxT(t), project, Limits{Timeout: MaxTimeout, MemoryLimitPages: pages}); err != nil {
			t.Fatal(err)
		}
	}
	roomy(good, 0)
	goodIn := admission(t, session.CreateRequest{Tier: intp(1), Template: "tpl_dev_polyglot@sha256:00", EndUserID: "u"})
	badIn := admission(t, session.CreateRequest{Tier: intp(1), Template: "windows", EndUserID: "u"})
	checkGood := func(t *testing.T) {
		t.Helper()
		if d := one(t, decide(t, h, good, goodIn)); !d.Allow || d.Decider != "plugin allowlist" {
			t.Fatalf("good plugin after a hostile one: %+v", d)
		}
		if d := one(t, decide(t, h, good, badIn)); d.Allow || !strings.Contains(d.Reasons[0], `template "windows"`) {
			t.Fatalf("good plugin after a hostile one: %+v", d)
		}
	}

	huge := wmod{memMin: 20, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1 << 20))}}.encode()
	cases := []struct {
		name     string
		wasm     []byte
		template string // for the Go guest
		want     string // the deny reason
	}{
		{"infinite loop", rawPlugin(`{}`, cat([]byte{opLoop, blockEmpty, opBr, 0, opEnd}, i64c(0))), "", "timed out after 20ms"},
		{"go infinite loop", guests["hostile"], "spin", "timed out after 20ms"},
		{"memory bomb", memoryBomb(), "", "trapped at its memory limit of 4 MiB: unreachable"},
		{"memory grow past the limit", bigGrow(), "", "trapped: unreachable"},
		{"go memory bomb", guests["hostile"], "oom", "ran out of memory at its memory limit of 8 MiB: fatal error: out of memory"},
		{"trap", rawPlugin(`{}`, cat([]byte{opUnreachable}, i64c(0))), "", "trapped: unreachable"},
		{"go panic", guests["hostile"], "panic", "crashed: panic: boom"},
		{"go deadlock", guests["hostile"], "exit", "crashed: fatal error: all goroutines are asleep - deadlock!"},
		{"huge output", huge, "", "answered 1048576 bytes, more than the 65536 allowed"},
		{"output out of bounds", rawPlugin(`{}`, i64c(0x7fff0000<<32|100)), "", "answered bytes 0x7fff0000+100, outside its memory of 65536 bytes"},
		{"not JSON", constPlugin(`allow: yes`), "", `answered invalid JSON: invalid character 'a' looking for beginning of value ("allow: yes")`},
		{"no allow", constPlugin(`{"reasons":["x"]}`), "", `answered JSON without a boolean "allow"`},
		{"wrong types", constPlugin(`{"allow":"yes"}`), "", "answered invalid JSON: cannot unmarshal string"},
		{"bad alloc", wmod{memMin: 1, memMax: -1, funcs: []wfunc{{name: "alloc", params: []byte{tI32}, results: []byte{tI32}, body: i32c(-16)},
			decideFunc(resultAt0(1))}}.encode(), "", "alloc(" /* (n) returned 0xfffffff0, outside … */},
		{"log out of bounds", wmod{memMin: 1, memMax: -1, imports: []wimport{{module: "wb", name: "log", params: []byte{tI32, tI32, tI32}}},
			funcs: []wfunc{allocFunc(), decideFunc(cat(i32c(1), i32c(65530), i32c(100), []byte{opCall, 0}, i64c(0)))}}.encode(),
			"", "wb.log: message 0xfffa+100 is outside the memory"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			project := fmt.Sprintf("proj-hostile-%d", i)
			if !strings.HasPrefix(c.want, "timed out") {
				pages := uint32(0)
				switch c.name {
				case "memory bomb":
					pages = 64
				case "go memory bomb":
					pages = 128
				}
				roomy(project, pages)
			}
			mustPut(t, h, project, "bad", c.wasm, 0, false)
			in := admission(t, session.CreateRequest{Tier: intp(1), Template: c.template})
			for range 2 { // the second call runs on a new instance
				d := one(t, decide(t, h, project, in))
				if d.Allow || d.Decider != "plugin bad" || len(d.Reasons) != 1 || !strings.HasPrefix(d.Reasons[0], "plugin bad: "+c.want) {
					t.Fatalf("got %+v, want a deny %q", d, "plugin bad: "+c.want)
				}
			}
			checkGood(t)
			// Fail-open: an allow with a warning naming the failure.
			mustPut(t, h, project, "bad", c.wasm, 0, true)
			d := one(t, decide(t, h, project, in))
			if !d.Allow || len(d.Warnings) != 1 || !strings.HasPrefix(d.Warnings[0], "plugin bad failed open: "+c.want) {
				t.Fatalf("fail-open: %+v", d)
			}
			checkGood(t)
		})
	}
	if !strings.Contains(sink.text(), "plugin failed project=proj-hostile-0 plugin=bad") {
		t.Fatalf("failures not logged:\n%s", sink.text())
	}

	// A Go plugin that panicked on one input serves the next on a fresh instance; its log
	// lines are capped per call.
	const p = "proj-hostile-go"
	roomy(p, 0)
	mustPut(t, h, p, "go", guests["hostile"], 0, false, WithConfig(map[string]string{"echo": "hi"}))
	for _, tpl := range []string{"panic", "ok", "spin", "ok", "log"} {
		d := one(t, decide(t, h, p, admission(t, session.CreateRequest{Tier: intp(1), Template: tpl})))
		if (tpl == "ok" || tpl == "log") != d.Allow || (d.Allow && !slices.Equal(d.Warnings, []string{"echo:hi"})) {
			t.Fatalf("%s: %+v", tpl, d)
		}
	}
	if n := strings.Count(sink.text(), "line x"); n != maxLogLines-1 {
		t.Fatalf("%d log lines kept, want %d", n, maxLogLines-1)
	}
}

// TestOutOfMemoryNamesTheLimit: a Go guest whose runtime asks for more memory than is left
// (it grows its heap 4 MiB at a time) runs out short of its limit; the reason still names
// the limit, and how much was in use. Before, it read "ran out of memory: fatal error: out
// of memory", which left a tenant to guess the limit.
func TestOutOfMemoryNamesTheLimit(t *testing.T) {
	h, _ := newTestHost(t, mini(t), Options{Timeout: DefaultTimeout})
	const p = "proj-oom"
	if err := h.SetLimits(ctxT(t), p, Limits{Timeout: MaxTimeout, MemoryLimitPages: 64}); err != nil {
		t.Fatal(err)
	}
	mustPut(t, h, p, "bad", guests["hostile"], 0, false)
	d := one(t, decide(t, h, p, admission(t, session.CreateRequest{Tier: intp(1), Template: "oom"})))
	re := regexp.MustCompile(`^plugin bad: ran out of memory with \d+ [KM]iB of its 4 MiB memory limit in use: fatal error: out of memory`)
	if d.Allow || len(d.Reasons) != 1 || !re.MatchString(d.Reasons[0]) {
		t.Fatalf("got %+v, want a deny matching %s", d, re)
	}
}

// TestNoLeak: 4,000 calls, with a failure (and so a new instance) every 50, leave the
// goroutines and the heap where they were. A leaked instance keeps a 64 KiB page at least, so
// one a failure would grow the heap by 5 MiB, past the 4 MiB margin, and a call's leak of over
// 1 KiB passes it too. (10,000 calls with a failure every 100 took 39 s of make test's two busy
// cores, for the same proof.)
func TestNoLeak(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	// The longest call deadline: this test counts leaks, not time, and one of 10,000 calls
	// took over a second on a cold run's busiest minute.
	h, _ := newTestHost(t, mini(t), Options{Timeout: MaxTimeout})
	const p = "proj-leak"
	mustPut(t, h, p, "allowlist", guests["allowlist"], 0, false, WithConfig(map[string]string{"allowlist": "*=base,panic"}))
	mustPut(t, h, p, "hostile", guests["hostile"], 1, false)
	ok := admission(t, session.CreateRequest{Tier: intp(1), Template: "base"})
	boom := admission(t, session.CreateRequest{Tier: intp(1), Template: "panic"})
	calls := func(n int) {
		for i := range n {
			in := ok
			failing := i%50 == 49
			if failing {
				in = boom
			}
			ds := decide(t, h, p, in)
			if len(ds) != 2 || !ds[0].Allow || ds[1].Allow != !failing {
				t.Fatalf("call %d: %+v", i, ds)
			}
		}
	}
	calls(500) // warm: pools full, caches made
	g0, heap0 := measure()
	start := time.Now()
	const n = 4_000
	calls(n)
	took := time.Since(start)
	// Goroutines of the last calls may still be on their way out on a busy machine: wait for
	// them, bounded.
	g1, heap1 := measure()
	for deadline := time.Now().Add(30 * time.Second); g1 > g0+2 && time.Now().Before(deadline); {
		g1, heap1 = measure()
	}
	t.Logf("%d decisions (2 plugins each) in %v (%v a decision); goroutines %d → %d; heap %d → %d KiB",
		n, took, took/n, g0, g1, heap0>>10, heap1>>10)
	if g1 > g0+2 {
		t.Errorf("goroutines grew from %d to %d", g0, g1)
	}
	if heap1 > heap0+4<<20 {
		t.Errorf("heap grew from %d to %d KiB", heap0>>10, heap1>>10)
	}
}

func measure() (goroutines int, heap uint64) {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
		time.Sleep(20 * time.Millisecond) // the point: finalizers and exiting goroutines run
	}
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), ms.HeapAlloc
}

// tableGrowPlugin is a module with one funcref table (min 0, no max) whose decide runs
// table.grow by delta and allows only if the grow failed (answered -1). wazero keeps tables in
// the host's heap, outside the memory cap.
func tableGrowPlugin(table []byte, delta int32) []byte {
	const deny, allow = `{"allow":false}`, `{"allow":true}`
	types := [][]byte{
		cat([]byte{0x60}, vec([]byte{tI32}), vec([]byte{tI32})),               // alloc
		cat([]byte{0x60}, vec([]byte{tI32}, []byte{tI32}), vec([]byte{tI64})), // decide
	}
	allocBody := cat(vec(), i32c(inputAt), []byte{opEnd})
	decideBody := cat(vec(),
		[]byte{0xd0, 0x70}, // ref.null func
		i32c(delta),
		[]byte{0xfc}, uleb(15), uleb(0), // table.grow 0
		i32c(-1), []byte{opI32Eq},
		[]byte{opIf, tI64}, i64c(int64(len(deny))<<32|int64(len(allow))),
		[]byte{0x05}, i64c(int64(len(deny))), // else
		[]byte{opEnd, opEnd})
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = append(m, section(1, vec(types...))...)
	m = append(m, section(3, vec(uleb(0), uleb(1)))...)
	m = append(m, section(4, vec(table))...)
	m = append(m, section(5, vec([]byte{0x00, 0x01}))...) // memory min 1 page, no max
	m = append(m, section(7, vec(
		cat(wstr("alloc"), []byte{0}, uleb(0)),
		cat(wstr("decide"), []byte{0}, uleb(1)),
		cat(wstr("memory"), []byte{2}, uleb(0))))...)
	m = append(m, section(10, vec(
		cat(uleb(uint64(len(allocBody))), allocBody),
		cat(uleb(uint64(len(decideBody))), decideBody)))...)
	m = append(m, section(11, vec(cat([]byte{0}, i32c(0), []byte{opEnd}, wstr(deny+allow))))...)
	return m
}

// TestTableGrowIsCapped: a table with no declared maximum cannot grow past MaxTableEntries
// (without the cap, 2²¹ entries took 16 MiB of the host's heap per call, outside the memory
// cap, and 2³¹ asked for 16 GiB at once); one within its share still grows.
func TestTableGrowIsCapped(t *testing.T) {
	h, _ := newTestHost(t, mini(t), Options{Timeout: MaxTimeout})
	in := admission(t, session.CreateRequest{Tier: intp(1), Template: "x"})
	noMax := []byte{0x70, 0x00, 0x00} // funcref, min 0, no max
	for _, c := range []struct {
		name      string
		table     []byte
		delta     int32
		wantAllow bool // the grow failed
	}{
		{"a grow of 2^21 entries, no declared maximum", noMax, 1 << 21, true},
		{"a grow of 2^31-1 entries, no declared maximum", noMax, 0x7fffffff, true},
		{"a grow past a declared maximum above the cap", cat([]byte{0x70, 0x01, 0x00}, uleb(1<<30)), 1 << 21, true},
		{"a grow within the cap", noMax, 1000, false},
	} {
		project := "proj-" + strconv.Itoa(int(c.delta))
		mustPut(t, h, project, "table", tableGrowPlugin(c.table, c.delta), 0, false)
		if d := one(t, decide(t, h, project, in)); d.Allow != c.wantAllow {
			t.Errorf("%s: allow = %v, want %v (allow means table.grow answered -1)", c.name, d.Allow, c.wantAllow)
		}
	}
}

// TestTablesOverTheCapRefused: a module whose tables' minimums exceed MaxTableEntries, or with
// too many tables, is refused at upload, before wazero allocates them.
func TestTablesOverTheCapRefused(t *testing.T) {
	h, _ := newTestHost(t, mini(t), Options{})
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"one table of 2^27 entries", vec(cat([]byte{0x70, 0x00}, uleb(1<<27))), "more than the 1048576"},
		{"two tables of 2^19+1", vec(cat([]byte{0x70, 0x00}, uleb(1<<19+1)), cat([]byte{0x70, 0x00}, uleb(1<<19+1))), "more than the 1048576"},
		{"17 tables", vec(slices.Repeat([][]byte{{0x70, 0x00, 0x00}}, 17)...), "at most 16"},
		{"a 64-bit table", vec([]byte{0x70, 0x04, 0x00}), "limits flags 0x4"},
	} {
		wasm := tableGrowPlugin([]byte{0x70, 0x00, 0x00}, 0)
		// Replace the module's table section with c.body.
		head, _, end, err := sectionAt(wasm, 4)
		if err != nil {
			t.Fatal(err)
		}
		wasm = slices.Concat(wasm[:head], section(4, c.body), wasm[end:])
		_, err = h.Validate(ctxT(t), wasm)
		var ve *ValidationError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a ValidationError with %q", c.name, err, c.want)
		}
	}
}

// bigLogPlugin: decide calls wb.log(3, 0, 16 MiB - 64 KiB) 32 times, then answers allow.
func bigLogPlugin() []byte {
	const n = 255 * 65536
	body := cat(
		i32c(32), []byte{opLocalSet, 2},
		[]byte{opLoop, blockEmpty},
		i32c(3), i32c(0), i32c(n), []byte{opCall, 0},
		[]byte{opLocalGet, 2}, i32c(1), []byte{opI32Sub, opLocalTee, 2},
		[]byte{opBrIf, 0},
		[]byte{opEnd},
		resultAt0(len(`{"allow":true}`)),
	)
	return wmod{memMin: 256, memMax: -1,
		imports: []wimport{{module: "wb", name: "log", params: []byte{tI32, tI32, tI32}}},
		funcs:   []wfunc{allocFunc(), decideFunc(body)},
		data:    []wdata{{0, []byte(`{"allow":true}`)}}}.encode()
}

// TestLogCopiesOnlyWhatItKeeps: wb.log keeps 1 KiB of a line, and copies no more of the
// module's memory than that (it copied the whole message before: 510 MiB for 32 lines of
// nearly 16 MiB, in host calls the deadline cannot stop).
func TestLogCopiesOnlyWhatItKeeps(t *testing.T) {
	h, _ := newTestHost(t, mini(t), Options{Timeout: MaxTimeout})
	const project = "proj-biglog"
	mustPut(t, h, project, "biglog", bigLogPlugin(), 0, false)
	in := admission(t, session.CreateRequest{Tier: intp(1), Template: "x"})
	_ = decide(t, h, project, in) // the instance is warm
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	d := one(t, decide(t, h, project, in))
	runtime.ReadMemStats(&after)
	if !d.Allow {
		t.Fatalf("decision: %+v, want allow", d)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("one decision made the host allocate %d MiB to log 32 lines of which it keeps 1 KiB each", alloc>>20)
	}
}

// TestDeclaredMemoryMaxAboveTheCapLoads: as ABI.md says, only a declared minimum above the
// memory cap stops a module loading; a maximum above it (what toolchains emit with a
// max-memory setting) is lowered to the cap (it was refused: "does not compile").
func TestDeclaredMemoryMaxAboveTheCapLoads(t *testing.T) {
	h, _ := newTestHost(t, mini(t), Options{})
	wasm := wmod{memMin: 1, memMax: 65536, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(len(`{"allow":true}`)))},
		data: []wdata{{0, []byte(`{"allow":true}`)}}}.encode()
	if _, err := h.Validate(ctxT(t), wasm); err != nil {
		t.Fatalf("a module of 1 to 65536 pages under a 256-page cap: %v", err)
	}
	mustPut(t, h, "proj-maxmem", "maxmem", wasm, 0, false)
	in := admission(t, session.CreateRequest{Tier: intp(1), Template: "x"})
	if d := one(t, decide(t, h, "proj-maxmem", in)); !d.Allow {
		t.Errorf("decision: %+v, want allow", d)
	}
}

// storesBody stores n constants into memory: real machine code for the compiler to write, about
// 10 bytes of body a store. salt makes each module's digest distinct.
func storesBody(n int, salt int32) []byte {
	var body []byte
	for i := range n {
		body = append(body, i32c(int32(i%60000))...)
		body = append(body, i32c(salt+int32(i))...)
		body = append(body, 0x36, 0x02, 0x00) // i32.store align=2 offset=0
	}
	return body
}

// TestCompileIsBounded: a module refused for its shape (no decide, a function's body or locals
// past the bounds) is refused before any compile, and compiles run one at a time, each waiting
// under its caller's context. The test holds the host's one compile slot, so a Validate that
// compiled would wait out its context. (A 1 MiB function without decide compiled before its
// exports were checked: +563 MiB of heap, any number of uploads at once.)
func TestCompileIsBounded(t *testing.T) {
	h, _ := newTestHost(t, nil, Options{CacheDir: t.TempDir()})
	fns := func(extra ...wfunc) []wfunc { return append([]wfunc{allocFunc(), decideFunc(resultAt0(1))}, extra...) }
	manyLocals := fns()
	for range MaxLocals/MaxFunctionLocals + 1 {
		manyLocals = append(manyLocals, wfunc{locals: MaxFunctionLocals})
	}
	cases := []struct {
		name, want string
		wasm       []byte
	}{
		{"no decide, one long function", "does not export the function decide (i32, i32) -> (i64)",
			wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), {name: "f", body: storesBody(20_000, 1)}}}.encode()},
		{"no memory", `does not export its memory as "memory"`,
			wmod{noMemory: true, funcs: fns()}.encode()},
		{"a function past the bound", fmt.Sprintf("function 2 is %d bytes of code, more than the 256 KiB a function may have: split it", len(storesBody(27_000, 2))+2),
			wmod{memMin: 1, memMax: -1, funcs: fns(wfunc{body: storesBody(27_000, 2)})}.encode()},
		{"a function's locals", fmt.Sprintf("function 2 declares more than the %d locals a function may have", MaxFunctionLocals),
			wmod{memMin: 1, memMax: -1, funcs: fns(wfunc{locals: MaxFunctionLocals + 1})}.encode()},
		{"the module's locals", fmt.Sprintf("its functions declare more than the %d locals a plugin's functions may have together", MaxLocals),
			wmod{memMin: 1, memMax: -1, funcs: manyLocals}.encode()},
	}
	release := holdCompiles(t, h) // every compile slot, taken
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
			defer cancel()
			_, err := h.Validate(ctx, c.wasm)
			var ve *ValidationError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a *ValidationError with %q, before any compile", err, c.want)
			}
		})
	}
	// A module that passes those checks waits for the slot, under its context.
	good := constPlugin(`{"allow":true}`)
	ctx, cancel := context.WithTimeout(ctxT(t), 200*time.Millisecond)
	defer cancel()
	if _, err := h.Validate(ctx, good); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a compile while another runs: %v, want it to wait (and end with its context)", err)
	}
	release()
	if _, err := h.Validate(ctxT(t), good); err != nil {
		t.Fatalf("once the slot is free: %v", err)
	}
	// A function just inside the bound compiles.
	if _, err := h.Validate(ctxT(t), wmod{memMin: 1, memMax: -1, funcs: fns(wfunc{body: storesBody(20_000, 3)})}.encode()); err != nil {
		t.Fatalf("a function of %d bytes: %v", len(storesBody(20_000, 3)), err)
	}
}

// TestCompileWaitsAreIndependent: a caller whose context ends while it waits to compile a
// module fails alone; another caller of the same module, waiting with a live context, compiles
// it rather than take the first one's context error.
func TestCompileWaitsAreIndependent(t *testing.T) {
	h, _ := newTestHost(t, nil, Options{CacheDir: t.TempDir()})
	wasm := constPlugin(`{"allow":"independent"}`)
	release := holdCompiles(t, h)
	short, cancel := context.WithTimeout(ctxT(t), 100*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := h.Validate(short, wasm); first <- err }()
	time.Sleep(20 * time.Millisecond) // the first caller is compiling (waiting for the slot)
	second := make(chan error, 1)
	go func() { _, err := h.Validate(ctxT(t), wasm); second <- err }()
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first: %v, want its deadline", err)
	}
	release()
	if err := <-second; err != nil {
		t.Fatalf("second, with a live context: %v", err)
	}
}

func cacheFileCount(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRefusedUploadsLeaveNoCompiledCode: wb keeps a compilation cache on disk (cmd/wb/decide.go)
// and wazero never evicts; a module refused after compiling (it fails to start, or has a wrong
// signature) must not leave its code there (ten refused uploads left 7× their size before).
func TestRefusedUploadsLeaveNoCompiledCode(t *testing.T) {
	dir := t.TempDir()
	h, _ := newTestHost(t, nil, Options{CacheDir: dir})
	ctx := ctxT(t)
	for i := range 5 {
		traps := wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1)),
			{name: "_initialize", body: cat(storesBody(1000, int32(i)), []byte{opUnreachable})}}}.encode()
		badSig := wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(),
			{name: "decide", params: []byte{tI32, tI32}, results: []byte{tI32}, body: cat(storesBody(1000, int32(i)), i32c(0))}}}.encode()
		for _, c := range []struct {
			wasm []byte
			want string
		}{{traps, "does not start"}, {badSig, "exports decide with the signature"}} {
			_, err := h.Validate(ctx, c.wasm)
			var ve *ValidationError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a *ValidationError with %q", err, c.want)
			}
		}
	}
	if n := cacheFileCount(t, dir); n != 0 {
		t.Errorf("10 refused uploads left %d files in the compilation cache", n)
	}
	// The cache still keeps what passed.
	if _, err := h.Validate(ctx, constPlugin(`{"allow":true}`)); err != nil {
		t.Fatal(err)
	}
	if n := cacheFileCount(t, dir); n == 0 {
		t.Errorf("a module that passed left nothing in the compilation cache")
	}
}

// initLogPlugin: its _initialize calls wb.log("flood") n times, then decide answers allow.
func initLogPlugin(n int32) []byte {
	const msgAt = 512
	body := cat(
		i32c(n), []byte{opLocalSet, 0},
		[]byte{opLoop, blockEmpty},
		i32c(1), i32c(msgAt), i32c(5), []byte{opCall, 0},
		[]byte{opLocalGet, 0}, i32c(1), []byte{opI32Sub, opLocalTee, 0},
		[]byte{opBrIf, 0},
		[]byte{opEnd},
	)
	return wmod{memMin: 1, memMax: -1,
		imports: []wimport{{module: "wb", name: "log", params: []byte{tI32, tI32, tI32}}},
		funcs: []wfunc{allocFunc(), decideFunc(resultAt0(len(`{"allow":true}`))),
			{name: "_initialize", locals: 1, body: body}},
		data: []wdata{{0, []byte(`{"allow":true}`)}, {msgAt, []byte("flood")}}}.encode()
}

// TestInitializeLogIsCapped: wb.log during _initialize keeps at most 32 lines a start, as in a
// call, and they name the project and the plugin (one upload wrote 20,000 lines, none naming
// either: the start had no call state).
func TestInitializeLogIsCapped(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{})
	const project = "proj-initlog"
	mustPut(t, h, project, "flood", initLogPlugin(10_000), 0, false) // two starts: the check and the warm-up
	text := sink.text()
	if n := strings.Count(text, "flood project="); n > 2*maxLogLines {
		t.Errorf("one upload (two starts) logged %d lines through wb.log, more than %d a start", n, maxLogLines)
	}
	if n := strings.Count(text, "flood project="+project+" plugin=flood"); n == 0 || n != strings.Count(text, "flood project=") {
		t.Errorf("of %d lines logged by the plugin's start, %d name its project and name", strings.Count(text, "flood project="), n)
	}
}

// parityTrapPlugin logs "started" in _initialize and traps in decide when the input's length is
// odd; otherwise it answers out.
func parityTrapPlugin(out string) []byte {
	const msgAt = 512
	start := cat(i32c(1), i32c(msgAt), i32c(7), []byte{opCall, 0})
	body := cat(
		[]byte{opLocalGet, 1}, i32c(1), []byte{0x71}, // i32.and
		[]byte{opIf, blockEmpty, opUnreachable, opEnd},
		resultAt0(len(out)),
	)
	return wmod{memMin: 1, memMax: -1,
		imports: []wimport{{module: "wb", name: "log", params: []byte{tI32, tI32, tI32}}},
		funcs:   []wfunc{allocFunc(), decideFunc(body), {name: "_initialize", body: start}},
		data:    []wdata{{0, []byte(out)}, {msgAt, []byte("started")}}}.encode()
}

// parityInputs answers an admission input of odd length and one of even length.
func parityInputs(t *testing.T) (odd, even []byte) {
	t.Helper()
	for _, tpl := range []string{"x", "xy"} {
		in := admission(t, session.CreateRequest{Tier: intp(1), Template: tpl})
		if len(in)%2 == 1 {
			odd = in
		} else {
			even = in
		}
	}
	if odd == nil || even == nil {
		t.Fatal("no inputs of both parities")
	}
	return odd, even
}

// refusedStart is the cause of a start that failStarts failed.
const refusedStart = "failed to start: trapped: start refused by the test"

// failStarts makes the starts of the project's plugin (a parityTrapPlugin) fail while fail is
// set: the wb.log of its "started" line traps.
func failStarts(sink *logSink, project, plugin string, fail *atomic.Bool) {
	line := "started project=" + project + " plugin=" + plugin
	sink.mu.Lock()
	defer sink.mu.Unlock()
	sink.onLine = func(l string) {
		if l == line && fail.Load() {
			panic("start refused by the test")
		}
	}
}

// TestFailingPluginIsNotRestartedEveryCall: after 3 failed starts in a row a plugin's instances
// are not restarted for a while (1 s, then doubling), its calls answering the last failure at
// once; then one call starts one again, and a start that succeeds ends the count. (Each call
// of a plugin whose starts fail paid a start, under the 1 s start deadline.)
func TestFailingPluginIsNotRestartedEveryCall(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{})
	const project = "proj-restart"
	var fail atomic.Bool
	failStarts(sink, project, "parity", &fail)
	mustPut(t, h, project, "parity", parityTrapPlugin(`{"allow":true}`), 0, false)
	starts := func() int { return strings.Count(sink.text(), "started project="+project) }
	odd, even := parityInputs(t)
	// A trap discards the warm instance: the next call starts one.
	if d := one(t, decide(t, h, project, odd)); d.Allow || !strings.HasSuffix(d.Reasons[0], "trapped: unreachable") {
		t.Fatalf("a call that traps: %+v", d)
	}
	fail.Store(true)
	before := starts()
	for i := range restartAfterFailures {
		if d := one(t, decide(t, h, project, even)); d.Allow || d.Reasons[0] != "plugin parity: "+refusedStart {
			t.Fatalf("failed start %d: %+v", i, d)
		}
	}
	if got := starts() - before; got != restartAfterFailures {
		t.Fatalf("%d failed starts logged %d starts", restartAfterFailures, got)
	}
	held := starts()
	for range 10 {
		d := one(t, decide(t, h, project, even))
		if want := "plugin parity: " + refusedStart + " (it failed 3 times in a row: not restarted for 1s)"; d.Allow || d.Reasons[0] != want {
			t.Fatalf("a call during the hold: %+v, want the deny %q", d, want)
		}
	}
	if n := starts() - held; n != 0 {
		t.Fatalf("10 calls during the hold started %d instances", n)
	}
	// The call after the hold starts one; it fails, and the hold doubles.
	time.Sleep(minRestartHold + 100*time.Millisecond)
	if d := one(t, decide(t, h, project, even)); d.Allow || d.Reasons[0] != "plugin parity: "+refusedStart {
		t.Fatalf("the call after the hold: %+v, want it to start an instance and fail", d)
	}
	if d := one(t, decide(t, h, project, even)); d.Allow || !strings.HasSuffix(d.Reasons[0], "(it failed 4 times in a row: not restarted for 2s)") {
		t.Fatalf("a call during the second hold: %+v", d)
	}
	fail.Store(false)
	time.Sleep(2*minRestartHold + 100*time.Millisecond)
	if d := one(t, decide(t, h, project, even)); !d.Allow {
		t.Fatalf("the call after the second hold: %+v, want it to start an instance and allow", d)
	}
	if n := starts() - held; n != 2 {
		t.Fatalf("the calls after the holds started %d instances, want 2", n)
	}
	// The start that succeeded ended the count: one more failed start is not held.
	one(t, decide(t, h, project, odd))
	fail.Store(true)
	one(t, decide(t, h, project, even))
	fail.Store(false)
	if d := one(t, decide(t, h, project, even)); !d.Allow {
		t.Fatalf("a call after one failed start: %+v, want allow", d)
	}
}

// TestRestartBackoffIsPerPlugin: failed starts of one plugin hold back its own restarts, not
// those of another plugin of the same module, in its project or another. (The count was kept
// per compiled module of a project, so two plugins uploading the same module held each other
// back.)
func TestRestartBackoffIsPerPlugin(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{})
	const project, other = "proj-backoff-a", "proj-backoff-b"
	var fail atomic.Bool
	failStarts(sink, project, "a", &fail)
	wasm := parityTrapPlugin(`{"allow":true}`)
	mustPut(t, h, project, "a", wasm, 0, false)
	mustPut(t, h, project, "b", wasm, 0, false)
	mustPut(t, h, other, "a", wasm, 0, false)
	odd, even := parityInputs(t)
	// Traps discard the warm instances: the next calls start new ones.
	decide(t, h, project, odd)
	decide(t, h, other, odd)
	fail.Store(true)
	for i := range restartAfterFailures + 2 {
		ds := decide(t, h, project, even)
		if len(ds) != 2 || ds[0].Allow || !strings.Contains(ds[0].Reasons[0], refusedStart) || !ds[1].Allow {
			t.Fatalf("call %d: %+v, want plugin a's start to fail and plugin b to allow", i, ds)
		}
		if d := one(t, decide(t, h, other, even)); !d.Allow {
			t.Fatalf("call %d of the other project's plugin a: %+v, want allow", i, d)
		}
	}
	if ds := decide(t, h, project, even); !strings.HasSuffix(ds[0].Reasons[0], "(it failed 3 times in a row: not restarted for 1s)") {
		t.Fatalf("plugin a after %d failed starts: %+v, want it held back", restartAfterFailures, ds[0])
	}
}

// TestTrapsDoNotHoldThePlugin: calls that trap on their input discard their instance but do
// not hold the plugin's restarts back: the next input is evaluated on a fresh instance. (Three
// crafted inputs held a fail-open plugin open, for 1 s to 30 s, for every caller of its
// project.)
func TestTrapsDoNotHoldThePlugin(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{})
	const project = "proj-traps"
	mustPut(t, h, project, "parity", parityTrapPlugin(`{"allow":false,"reasons":["evaluated"]}`), 0, true)
	starts := func() int { return strings.Count(sink.text(), "started project="+project) }
	odd, even := parityInputs(t)
	before := starts()
	for round := range 2 {
		for i := range restartAfterFailures + 1 {
			if d := one(t, decide(t, h, project, odd)); !d.Allow || len(d.Warnings) != 1 || !strings.HasSuffix(d.Warnings[0], "failed open: trapped: unreachable") {
				t.Fatalf("round %d, trap %d: %+v, want an allow failing open on the trap", round, i, d)
			}
		}
		if d := one(t, decide(t, h, project, even)); d.Allow || len(d.Reasons) != 1 || d.Reasons[0] != "evaluated" {
			t.Fatalf("round %d: the call after %d traps: %+v, want it evaluated (a deny, \"evaluated\")", round, restartAfterFailures+1, d)
		}
	}
	// Each trap discarded its instance: the next call started a fresh one.
	if n, want := starts()-before, 2*(restartAfterFailures+1); n != want {
		t.Errorf("%d traps were followed by %d starts, want %d", want, n, want)
	}
}

// TestRestartsAfterTrapsArePaced: a plugin whose calls all trap, with a slow _initialize,
// starts an instance after each failed call no sooner than restartCostFactor times its last
// start: a second of calls that trap cost about a tenth of it in starts, not all of it (an
// _initialize near the 1 s start deadline made each call cost a second of the gateway's CPU).
// Its callers wait for the start: a call that does not trap is still evaluated.
func TestRestartsAfterTrapsArePaced(t *testing.T) {
	const startTakes = 40 * time.Millisecond
	h, sink := newTestHost(t, mini(t), Options{})
	const project = "proj-paced"
	line := "started project=" + project + " plugin=parity"
	sink.mu.Lock()
	sink.onLine = func(l string) {
		if l == line {
			time.Sleep(startTakes) // inside _initialize: a slow start
		}
	}
	sink.mu.Unlock()
	mustPut(t, h, project, "parity", parityTrapPlugin(`{"allow":false,"reasons":["evaluated"]}`), 0, true)
	starts := func() int { return strings.Count(sink.text(), line) }
	odd, even := parityInputs(t)
	before, calls := starts(), 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); calls++ {
		if d := one(t, decide(t, h, project, odd)); !d.Allow || len(d.Warnings) != 1 || !strings.HasSuffix(d.Warnings[0], "failed open: trapped: unreachable") {
			t.Fatalf("trap %d: %+v, want an allow failing open on the trap", calls, d)
		}
	}
	// Unpaced, each trap is followed by a start: about 1 s / 40 ms of them. Paced, about
	// 1 s / 400 ms.
	if n := starts() - before; n > 6 {
		t.Errorf("%d calls that trapped in 1 s were followed by %d starts of %s each, want at most 6", calls, n, startTakes)
	}
	if d := one(t, decide(t, h, project, even)); d.Allow || len(d.Reasons) != 1 || d.Reasons[0] != "evaluated" {
		t.Errorf("the call after the traps: %+v, want it evaluated (a deny, \"evaluated\")", d)
	}

	// Callers trapping together start one at a time: each took the first free slot, and
	// started together, up to the pool's size at once.
	before = starts()
	var wg sync.WaitGroup
	began := time.Now()
	end := began.Add(time.Second)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(end) {
				if _, err := h.Decide(context.Background(), project, session.PointAdmission, odd); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// The callers that took a slot in that second wait for it: the share of the time spent
	// in starts is what is bounded (about a tenth; unpaced, more than half).
	n, took := starts()-before, time.Since(began)
	if share := float64(time.Duration(n)*startTakes) / float64(took); share > 0.25 {
		t.Errorf("8 callers trapping together: %d starts of %s each in %s, %.0f%% of the time, want at most 25%%", n, startTakes, took.Round(time.Millisecond), 100*share)
	}
}

// TestCacheIsBoundedAtStart: a host starting on a compilation cache larger than MaxCacheBytes
// removes its oldest files until the rest fit (wazero never removes any).
func TestCacheIsBoundedAtStart(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "wazero-old")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i := range 10 {
		f := filepath.Join(old, strconv.Itoa(i))
		if err := os.WriteFile(f, make([]byte, 1000), 0o644); err != nil {
			t.Fatal(err)
		}
		// File i is i hours old: 9 is the oldest.
		if err := os.Chtimes(f, now, now.Add(-time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	newTestHost(t, nil, Options{CacheDir: dir, MaxCacheBytes: 4500})
	var left []string
	entries, err := os.ReadDir(old)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{"0", "1", "2", "3"}; !slices.Equal(left, want) {
		t.Errorf("a 10,000-byte cache bounded at 4,500 kept %v, want the newest %v", left, want)
	}
}

// recursePlugin: decide calls f(depth), where f(n) = n == 0 ? 0 : f(n-1) + 1, then answers
// allow. wazero keeps the call stack in the host's heap, outside the memory cap, and grows it
// (up to about 100 MiB) as deep as the recursion goes.
func recursePlugin(depth int32) []byte {
	out := `{"allow":true}`
	f := cat(
		[]byte{opLocalGet, 0, opI32Eqz},
		[]byte{opIf, tI32}, i32c(0),
		[]byte{0x05},                                                                       // else
		[]byte{opLocalGet, 0}, i32c(1), []byte{opI32Sub, opCall, 2}, i32c(1), []byte{0x6a}, // i32.add
		[]byte{opEnd})
	return wmod{memMin: 1, memMax: -1,
		funcs: []wfunc{allocFunc(), decideFunc(cat(i32c(depth), []byte{opCall, 2, opDrop}, resultAt0(len(out)))),
			{params: []byte{tI32}, results: []byte{tI32}, body: f}},
		data: []wdata{{0, []byte(out)}}}.encode()
}

// TestCallStackIsNotKept: a recursion inside MaxStackBytes is allowed, and the call stack it
// grew is not kept by the pooled instance after the call (up to twice MaxStackBytes an
// instance, outside the memory cap).
func TestCallStackIsNotKept(t *testing.T) {
	h, _ := newTestHost(t, mini(t), Options{Timeout: MaxTimeout})
	const project = "proj-stack"
	in := admission(t, session.CreateRequest{Tier: intp(1), Template: "x"})
	mustPut(t, h, project, "deep", recursePlugin(2000), 0, false)
	_, base := measure()
	if d := one(t, decide(t, h, project, in)); !d.Allow {
		t.Fatalf("decision: %+v", d)
	}
	_, after := measure()
	if kept := int64(after) - int64(base); kept > 4<<20 {
		t.Errorf("one allowed decision of a recursion left the host's heap %d MiB larger (its call stack, kept by the pooled instance)", kept>>20)
	}
}

// TestStoredModuleShapeIsChecked: a stored module past the bounds (let in by an older host) is
// not compiled when a gateway loads it: the plugin fails to load, saying why.
func TestStoredModuleShapeIsChecked(t *testing.T) {
	rdb := mini(t)
	h, _ := newTestHost(t, rdb, Options{})
	const project = "proj-stored-shape"
	p := mustPut(t, h, project, "big", constPlugin(`{"allow":true}`), 0, false)
	big := wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1)), {body: storesBody(27_000, 5)}}}.encode()
	p.Digest = Digest(big)
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	k := projectKeys(project)
	if err := rdb.Set(ctx, k.wasm(p.Digest), big, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, k.meta(), "big", b).Err(); err != nil {
		t.Fatal(err)
	}
	h.Forget(project)
	holdCompiles(t, h) // a compile would wait; the check comes first
	in := admission(t, session.CreateRequest{Tier: intp(1), Template: "x"})
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ds, err := h.Decide(wait, project, session.PointAdmission, in)
	if err != nil {
		t.Fatalf("decide: %v (it waited to compile the module)", err)
	}
	d := one(t, ds)
	if want := "plugin big: could not be loaded: invalid plugin: function 2 is"; d.Allow || !strings.HasPrefix(d.Reasons[0], want) {
		t.Fatalf("decision: %+v, want a deny beginning %q", d, want)
	}
}

// TestLogIsRateLimited: a project's plugins keep at most logbudget.Burst lines of wb.log at once, and
// logbudget.Rate a second after that, in all their calls together; the lines past it are dropped,
// and a line of the host's says so (at most one each logbudget.NoteEvery). Before, each call's
// 32 lines were all kept: a plugin that logged 32 KiB at every decision, which its tenant's
// guests cause by the thousand a second (every exec, every egress attempt), wrote the
// operator's log without bound.
func TestLogIsRateLimited(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{Timeout: MaxTimeout})
	const project = "proj-logflood"
	mustPut(t, h, project, "biglog", bigLogPlugin(), 0, false)
	in := admission(t, session.CreateRequest{Tier: intp(1), Template: "x"})
	start := time.Now()
	const calls = 100
	for range calls {
		if d := one(t, decide(t, h, project, in)); !d.Allow {
			t.Fatalf("decision: %+v, want allow", d)
		}
	}
	took := time.Since(start)
	text := sink.text()
	kept := strings.Count(text, "project="+project+" plugin=biglog")
	// Wide: the calls' time, counted twice over, at logbudget.Rate.
	most := logbudget.Burst + int(2*took.Seconds()*logbudget.Rate) + 1
	if kept > most {
		t.Errorf("%d calls in %s kept %d lines of wb.log (%d KiB), want at most %d (%d at once, %d a second)",
			calls, took.Round(time.Millisecond), kept, kept, most, logbudget.Burst, logbudget.Rate)
	}
	if !strings.Contains(text, "dropped") || !strings.Contains(text, project) {
		t.Errorf("no line of the host's says that the project's plugins' lines were dropped")
	}
}

// TestFailureLogIsRateLimited: the host's line for each failed call of a project's plugins
// ("plugin failed", naming its cause: up to 2 KiB of what it printed) keeps to a budget of its
// own, as the plugins' wb.log lines do, and a line says how many were dropped. Before, a
// plugin that trapped at every decision wrote one for each: about a thousand a second here.
func TestFailureLogIsRateLimited(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{Timeout: MaxTimeout})
	const project = "proj-trapflood"
	mustPut(t, h, project, "trap", rawPlugin(`{"allow":true}`, []byte{opUnreachable}), 0, true)
	in := admission(t, session.CreateRequest{Tier: intp(1), Template: "x"})
	// Until the calls are 64 past the budget (its burst, and its rate over their time): a
	// cold make test on a loaded machine made only 270 calls in a fixed 1.5 s, all within it.
	start := time.Now()
	calls := 0
	for ; calls < logbudget.Burst+int(time.Since(start).Seconds()*logbudget.Rate)+64; calls++ {
		if time.Since(start) > time.Minute {
			t.Fatalf("%d calls in a minute, too slow to pass the log's budget of %s", calls, logbudget.Limits())
		}
		if d := one(t, decide(t, h, project, in)); !d.Allow {
			t.Fatalf("decision of a plugin that fails open: %+v, want allow", d)
		}
	}
	took := time.Since(start)
	text := sink.text()
	kept := strings.Count(text, "plugin failed project="+project)
	most := logbudget.Burst + int(2*took.Seconds()*logbudget.Rate) + 1
	if kept > most {
		t.Errorf("%d failed calls in %s logged %d lines \"plugin failed\", want at most %d (%d at once, %d a second)",
			calls, took.Round(time.Millisecond), kept, most, logbudget.Burst, logbudget.Rate)
	}
	if kept == 0 || !strings.Contains(text, "failures were dropped") {
		t.Errorf("%d lines \"plugin failed\", and no line says that some were dropped", kept)
	}
}
