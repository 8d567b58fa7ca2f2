package plugins

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"wb/session"
)

// memoryBomb grows memory 15 pages at a time (to exactly 256) until memory.grow fails, then traps.
func memoryBomb() []byte {
	body := cat(
		[]byte{opLoop, blockEmpty},
		i32c(15), []byte{opMemoryGrow, 0},
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
	// Generous limits where a timeout is not the point: the machine may be loaded.
	roomy := func(project string) {
		t.Helper()
		if err := h.SetLimits(ctxT(t), project, Limits{Timeout: MaxTimeout}); err != nil {
			t.Fatal(err)
		}
	}
	roomy(good)
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
		{"memory bomb", memoryBomb(), "", "trapped at its memory limit of 16 MiB: unreachable"},
		{"memory grow past the limit", bigGrow(), "", "trapped: unreachable"},
		{"go memory bomb", guests["hostile"], "oom", "ran out of memory at its memory limit of 16 MiB: fatal error: out of memory"},
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
				roomy(project)
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
	roomy(p)
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
