package plugins

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

func TestValidate(t *testing.T) {
	// Its last call runs a good module: at the default 20 ms a loaded machine failed it (and
	// at 1 s, a cold run failed TestCall's alike).
	h, _ := newTestHost(t, nil, Options{Timeout: MaxTimeout})
	for _, name := range []string{"allowlist", "tiercap", "requiremeta", "noop", "hostile"} {
		// TestMain compiled each into the shared cache: this loads it.
		d, err := h.Validate(ctxT(t), guests[name])
		if err != nil || d != Digest(guests[name]) || !strings.HasPrefix(d, "sha256:") || len(d) != 71 {
			t.Fatalf("%s: %q %v", name, d, err)
		}
	}
	ctx := ctxT(t)
	if _, err := h.Validate(ctx, constPlugin(`{"allow":true}`)); err != nil {
		t.Fatal(err)
	}

	good := func(m wmod) wmod { return m }
	base := wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1))}}
	withImport := func(module, name string, params, results []byte) []byte {
		m := good(base)
		m.imports = []wimport{{module: module, name: name, params: params, results: results}}
		return m.encode()
	}
	cases := []struct {
		name, want string
		wasm       []byte
	}{
		{"empty", "empty module", nil},
		{"not wasm", "not a WebAssembly binary", []byte("hello world, not wasm")},
		{"component", "components are not supported", []byte("\x00asm\x0d\x00\x01\x00")},
		{"too big", "more than the 10 MiB", make([]byte, MaxWasmBytes+1)},
		{"truncated", "malformed module: truncated", constPlugin(`{"allow":true}`)[:30]},
		{"no decide", "does not export the function decide (i32, i32) -> (i64)",
			wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc()}}.encode()},
		{"no alloc", "does not export the function alloc (i32) -> (i32)",
			wmod{memMin: 1, memMax: -1, funcs: []wfunc{decideFunc(resultAt0(1))}}.encode()},
		{"bad decide", "exports decide with the signature (i32, i32) -> (i32), want (i32, i32) -> (i64)",
			wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), {name: "decide", params: []byte{tI32, tI32}, results: []byte{tI32}, body: i32c(0)}}}.encode()},
		{"no memory", `does not export its memory as "memory"`,
			wmod{noMemory: true, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1))}}.encode()},
		{"memory misnamed", `does not export its memory as "memory"`,
			wmod{memMin: 1, memMax: -1, memExport: "mem", funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1))}}.encode()},
		{"path_open", "imports wasi_snapshot_preview1.path_open: plugins have no file system",
			withImport("wasi_snapshot_preview1", "path_open", []byte{tI32, tI32, tI32, tI32, tI32, tI64, tI64, tI32, tI32}, []byte{tI32})},
		{"fd_read", "imports wasi_snapshot_preview1.fd_read: plugins have no file system",
			withImport("wasi_snapshot_preview1", "fd_read", []byte{tI32, tI32, tI32, tI32}, []byte{tI32})},
		{"sock_accept", "imports wasi_snapshot_preview1.sock_accept: plugins have no network access",
			withImport("wasi_snapshot_preview1", "sock_accept", []byte{tI32, tI32, tI32}, []byte{tI32})},
		{"other wasi", "imports wasi_snapshot_preview1.proc_raise: not allowed (the WASI functions allowed are args_get",
			withImport("wasi_snapshot_preview1", "proc_raise", []byte{tI32}, []byte{tI32})},
		{"unknown module", `imports env.abort: unknown module "env"`,
			withImport("env", "abort", []byte{tI32}, nil)},
		{"unknown wb", "imports wb.exec: the wb module has only log and config_get",
			withImport("wb", "exec", nil, nil)},
		{"wrong signature", "imports wb.log with the signature (i32) -> (), want (i32, i32, i32) -> ()",
			withImport("wb", "log", []byte{tI32}, nil)},
		{"imported memory", "imports memory env.memory: a plugin may import only functions",
			wmod{noMemory: true, imports: []wimport{{module: "env", name: "memory", kind: 2, memMin: 1}},
				funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1))}}.encode()},
		{"imported global", "imports global wb.g: a plugin may import only functions",
			wmod{memMin: 1, memMax: -1, imports: []wimport{{module: "wb", name: "g", kind: 3}},
				funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1))}}.encode()},
		{"command", "is a WASI command (exports _start)",
			wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1)), {name: "_start"}}}.encode()},
		{"bad initialize", "exports _initialize with the signature (i32) -> ()",
			wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1)), {name: "_initialize", params: []byte{tI32}}}}.encode()},
		{"initialize traps", "does not start: failed to start: trapped: unreachable",
			wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1)), {name: "_initialize", body: []byte{opUnreachable}}}}.encode()},
		{"memory over the limit", "does not compile",
			wmod{memMin: 300, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1))}}.encode()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := h.Validate(ctx, c.wasm)
			var ve *ValidationError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a *ValidationError with %q", err, c.want)
			}
		})
	}
	// A start that spins ends at the host's start deadline (here a short one of its own: the
	// tests' other hosts allow a loaded machine far more, see newTestHost).
	t.Run("initialize spins", func(t *testing.T) {
		quick, _ := newTestHost(t, nil, Options{InitTimeout: 300 * time.Millisecond})
		spin := wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(1)),
			{name: "_initialize", body: []byte{opLoop, blockEmpty, opBr, 0, opEnd}}}}.encode()
		_, err := quick.Validate(ctx, spin)
		var ve *ValidationError
		if want := "does not start: failed to start: timed out after 300ms"; !errors.As(err, &ve) || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want a *ValidationError with %q", err, want)
		}
	})
	// The host still validates and runs good modules afterwards.
	d, _, err := h.Call(ctx, guests["allowlist"], admission(t, session.CreateRequest{Tier: intp(1), Template: "tpl_dev_polyglot"}))
	if err != nil || !d.Allow {
		t.Fatalf("%+v %v", d, err)
	}
}

func TestExamples(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{Timeout: MaxTimeout}) // a loaded machine is no failure here
	ctx := ctxT(t)
	const p = "proj-examples"
	mustPut(t, h, p, "allowlist", guests["allowlist"], 10, false, WithConfig(map[string]string{"allowlist": "alice=python,node;*=base"}))
	mustPut(t, h, p, "tiercap", guests["tiercap"], 20, false)
	mustPut(t, h, p, "requiremeta", guests["requiremeta"], 30, false, WithConfig(map[string]string{"required": "team,cost_center", "defaults": "cost_center=shared"}))

	ds := decide(t, h, p, admission(t, session.CreateRequest{Tier: intp(3), Template: "gpu", EndUserID: "alice", Metadata: map[string]string{"team": "core"}}))
	if len(ds) != 3 {
		t.Fatalf("%+v", ds)
	}
	if d := ds[0]; d.Allow || d.Decider != "plugin allowlist" ||
		!reflect.DeepEqual(d.Reasons, []string{`template "gpu" is not on the allowlist for end user "alice" (allowed: python, node)`}) {
		t.Fatalf("allowlist: %+v", d)
	}
	if d := ds[1]; !d.Allow || d.Decider != "plugin tiercap" || d.Patch != nil {
		t.Fatalf("tiercap: %+v", d)
	}
	if d := ds[2]; !d.Allow || d.Decider != "plugin requiremeta" || !reflect.DeepEqual(d.Patch, map[string]any{"metadata": map[string]any{"cost_center": "shared"}}) ||
		!reflect.DeepEqual(d.Warnings, []string{"metadata defaults applied: cost_center=shared"}) {
		t.Fatalf("requiremeta: %+v", d)
	}

	req := session.CreateRequest{Tier: intp(3), Template: "base", EndUserID: "free_42"}
	ds = decide(t, h, p, admission(t, req))
	if d := ds[0]; !d.Allow {
		t.Fatalf("allowlist: %+v", d)
	}
	if d := ds[1]; !d.Allow || !reflect.DeepEqual(d.Patch, map[string]any{"tier": 1.0}) ||
		!reflect.DeepEqual(d.Warnings, []string{`tier lowered from 3 to 1: end users with the prefix "free_" are capped at tier 1`}) {
		t.Fatalf("tiercap: %+v", d)
	}
	if d := ds[2]; d.Allow || !reflect.DeepEqual(d.Reasons, []string{"missing required metadata: team"}) {
		t.Fatalf("requiremeta: %+v", d)
	}
	patched, err := ApplyPatch(req, ds...)
	if err != nil || *patched.Tier != 1 || patched.Template != "base" || *req.Tier != 3 {
		t.Fatalf("%+v %v", patched, err)
	}
	if !strings.Contains(sink.text(), "lowering tier 3 to 1 for free_42 project=proj-examples plugin=tiercap") {
		t.Fatalf("plugin log missing:\n%s", sink.text())
	}

	// tiercap in deny mode; requiremeta with its defaults only.
	mustPut(t, h, p, "tiercap", guests["tiercap"], 20, false, WithConfig(map[string]string{"mode": "deny", "caps": "trial_=2"}))
	ds = decide(t, h, p, admission(t, session.CreateRequest{Tier: intp(4), Template: "base", EndUserID: "trial_1", Metadata: map[string]string{"team": "x"}}))
	if d := ds[1]; d.Allow || !reflect.DeepEqual(d.Reasons, []string{`tier 4 is above the cap of tier 2 for end users with the prefix "trial_"`}) {
		t.Fatalf("tiercap deny: %+v", d)
	}
	// Other points: the examples allow.
	in, err := Runtime(p, &session.Session{ID: "ses_1", Tier: 4}, RuntimeEvent{Type: "egress", Data: map[string]any{"host": "x"}}, time.Now()).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if ds, err := h.Decide(ctx, p, session.PointRuntime, in); err != nil || len(ds) != 0 {
		t.Fatalf("runtime: %+v %v", ds, err)
	}
}

func TestApplyPatch(t *testing.T) {
	req := session.CreateRequest{Tier: intp(3), Template: "t", Metadata: map[string]string{"a": "1", "b": "2"}}
	got, err := ApplyPatch(req,
		session.Decision{Patch: map[string]any{"tier": 2, "metadata": map[string]any{"b": nil, "c": "3"}}},
		session.Decision{},
		session.Decision{Patch: map[string]any{"tier": 1.0, "region": "eu"}})
	want := session.CreateRequest{Tier: intp(1), Template: "t", Region: "eu", Metadata: map[string]string{"a": "1", "c": "3"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := ApplyPatch(req, session.Decision{Patch: map[string]any{"tier": "high"}}); err == nil {
		t.Fatal("a patch that does not fit was accepted")
	}
}

// TestStore runs the Redis side against a real server, miniredis and a cluster.
func TestStore(t *testing.T) {
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.New(t)
			h, _ := newTestHost(t, rdb, Options{})
			ctx := ctxT(t)
			const p = "proj-store"
			a := constPlugin(`{"allow":true}`)
			c := constPlugin(`{"allow":false,"reasons":["no"]}`)
			if _, err := h.Put(ctx, p, "Bad Name", a, []string{"admission"}, 0, false); !isInvalid(err, "name") {
				t.Fatal(err)
			}
			if _, err := h.Put(ctx, p, "x", a, []string{"boot"}, 0, false); !isInvalid(err, `unknown point "boot"`) {
				t.Fatal(err)
			}
			if _, err := h.Put(ctx, p, "x", a, nil, 0, false); !isInvalid(err, "at least one point") {
				t.Fatal(err)
			}
			if _, err := h.Put(ctx, "a}b", "x", a, []string{"admission"}, 0, false); !isInvalid(err, "project id") {
				t.Fatal(err)
			}
			if _, err := h.Put(ctx, p, "x", a, []string{"admission"}, 0, false, WithConfig(map[string]string{"bad key": "v"})); !isInvalid(err, "config key") {
				t.Fatal(err)
			}
			if _, err := h.Put(ctx, p, "x", []byte("nope"), []string{"admission"}, 0, false); !isInvalid(err, "not a WebAssembly") {
				t.Fatal(err)
			}
			p1, err := h.Put(ctx, p, "zeta", a, []string{"admission", "spend", "admission"}, 1, true)
			if err != nil || p1.Digest != Digest(a) || !slices.Equal(p1.Points, []string{"admission", "spend"}) || p1.SizeBytes != len(a) || !p1.FailOpen {
				t.Fatalf("%+v %v", p1, err)
			}
			mustPut(t, h, p, "alpha", c, 1, false)
			mustPut(t, h, p, "beta", a, 0, false) // same digest as zeta
			list, err := h.List(ctx, p)
			if err != nil || len(list) != 3 || list[0].Name != "beta" || list[1].Name != "alpha" || list[2].Name != "zeta" {
				t.Fatalf("%+v %v", list, err)
			}
			got, err := h.Get(ctx, p, "zeta")
			if err != nil || got.Digest != p1.Digest || !got.CreatedAt.Equal(p1.CreatedAt) {
				t.Fatalf("%+v %v", got, err)
			}
			if _, err := h.Get(ctx, p, "nope"); !errors.Is(err, ErrNotFound) {
				t.Fatal(err)
			}
			ds := decide(t, h, p, admission(t, session.CreateRequest{Tier: intp(1)}))
			if len(ds) != 3 || ds[0].Decider != "plugin beta" || ds[1].Decider != "plugin alpha" || ds[1].Allow || ds[2].Decider != "plugin zeta" {
				t.Fatalf("%+v", ds)
			}
			// Every key is the project's, hash-tagged; blobs are kept while a plugin uses them.
			keys, err := allKeys(ctx, rdb)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if !strings.HasPrefix(k, "wb:{"+p+"}:plugin:") {
					t.Fatalf("key %s", k)
				}
			}
			hex := func(w []byte) string { return strings.TrimPrefix(Digest(w), "sha256:") }
			blob := func(w []byte) bool { return rdb.Exists(ctx, "wb:{"+p+"}:plugin:wasm:"+hex(w)).Val() == 1 }
			if !blob(a) || !blob(c) {
				t.Fatal("blobs missing")
			}
			if err := h.Delete(ctx, p, "zeta"); err != nil {
				t.Fatal(err)
			}
			if !blob(a) {
				t.Fatal("blob of beta deleted with zeta")
			}
			mustPut(t, h, p, "beta", c, 0, false) // beta moves to c: a is unused
			if blob(a) || !blob(c) {
				t.Fatal("blob of a kept after its last user moved")
			}
			if err := h.Delete(ctx, p, "zeta"); !errors.Is(err, ErrNotFound) {
				t.Fatal(err)
			}
			for _, n := range []string{"alpha", "beta"} {
				if err := h.Delete(ctx, p, n); err != nil {
					t.Fatal(err)
				}
			}
			if blob(c) {
				t.Fatal("blob kept after the last delete")
			}
			if ds := decide(t, h, p, admission(t, session.CreateRequest{Tier: intp(1)})); len(ds) != 0 {
				t.Fatalf("%+v", ds)
			}
			if list, err := h.List(ctx, p); err != nil || len(list) != 0 {
				t.Fatalf("%+v %v", list, err)
			}
		})
	}
}

func isInvalid(err error, want string) bool {
	var ve *ValidationError
	return errors.As(err, &ve) && strings.Contains(err.Error(), want)
}

func allKeys(ctx context.Context, rdb redis.UniversalClient) ([]string, error) {
	c, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return rdb.Keys(ctx, "*").Result()
	}
	var mu sync.Mutex
	var out []string
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		ks, err := n.Keys(ctx, "*").Result()
		mu.Lock()
		out = append(out, ks...)
		mu.Unlock()
		return err
	})
	return out, err
}

// TestReplicas: a change through one host reaches another within RefreshInterval.
func TestReplicas(t *testing.T) {
	rdb := mini(t)
	a, _ := newTestHost(t, rdb, Options{})
	b, _ := newTestHost(t, rdb, Options{RefreshInterval: 20 * time.Millisecond})
	const p = "proj-replicas"
	in := admission(t, session.CreateRequest{Tier: intp(1)})
	if ds := decide(t, b, p, in); len(ds) != 0 {
		t.Fatalf("%+v", ds)
	}
	mustPut(t, a, p, "deny", constPlugin(`{"allow":false,"reasons":["v1"]}`), 0, false)
	waitFor(t, func() bool {
		ds := decide(t, b, p, in)
		return len(ds) == 1 && slices.Equal(ds[0].Reasons, []string{"v1"})
	})
	mustPut(t, a, p, "deny", constPlugin(`{"allow":false,"reasons":["v2"]}`), 0, false)
	waitFor(t, func() bool {
		ds := decide(t, b, p, in)
		return len(ds) == 1 && slices.Equal(ds[0].Reasons, []string{"v2"})
	})
	if err := a.Delete(ctxT(t), p, "deny"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(decide(t, b, p, in)) == 0 })
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHotSwap: calls running when a new version is put finish on the old one; later calls use
// the new one.
func TestHotSwap(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{PoolSize: 4})
	ctx := ctxT(t)
	const p = "proj-swap"
	if err := h.SetLimits(ctx, p, Limits{Timeout: MaxTimeout}); err != nil {
		t.Fatal(err)
	}
	// v1 logs "start", and the log call (the sink's on) holds it until the swap is done: the
	// calls are in flight during the swap on any machine, with no spin to time.
	v1 := logSpinPlugin(`{"allow":true,"warnings":["v1"]}`, 1)
	mustPut(t, h, p, "swap", v1, 0, false)
	started, release := make(chan struct{}, 8), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	sink.mu.Lock()
	sink.on = func(msg string) {
		if msg == "start" {
			started <- struct{}{}
			<-release
		}
	}
	sink.mu.Unlock()

	in := admission(t, session.CreateRequest{Tier: intp(1)})
	const n = 3
	var wg sync.WaitGroup
	results := make([]session.Decision, n)
	for i := range n {
		wg.Go(func() { results[i] = one(t, decide(t, h, p, in)) })
	}
	for range n {
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatal("calls did not start")
		}
	}
	mustPut(t, h, p, "swap", constPlugin(`{"allow":true,"warnings":["v2"]}`), 0, false)
	if d := one(t, decide(t, h, p, in)); !slices.Equal(d.Warnings, []string{"v2"}) {
		t.Fatalf("after the swap: %+v", d)
	}
	releaseOnce()
	wg.Wait()
	for _, d := range results {
		if !d.Allow || !slices.Equal(d.Warnings, []string{"v1"}) {
			t.Fatalf("in-flight call: %+v", d)
		}
	}
	// The old version's compiled module is released once its last instance is back.
	waitFor(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		_, ok := h.modules[moduleKey{DefaultMemoryLimitPages, Digest(v1)}]
		return !ok
	})
}

// TestPoolBound: with every instance busy, a call waits under its context.
func TestPoolBound(t *testing.T) {
	h, sink := newTestHost(t, mini(t), Options{PoolSize: 1, Timeout: MaxTimeout})
	const p = "proj-pool"
	// The first call holds the only instance: its log call (the sink's on) returns once the
	// second call has given up, however slow the machine.
	mustPut(t, h, p, "slow", logSpinPlugin(`{"allow":true}`, 1), 0, false)
	started, release := make(chan struct{}, 1), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	sink.mu.Lock()
	sink.on = func(msg string) {
		if msg == "start" {
			started <- struct{}{}
			<-release
		}
	}
	sink.mu.Unlock()
	in := admission(t, session.CreateRequest{Tier: intp(1)})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if d := one(t, decide(t, h, p, in)); !d.Allow {
			t.Errorf("%+v", d)
		}
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := h.Decide(ctx, p, session.PointAdmission, in); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting call: %v", err)
	}
	releaseOnce()
	<-done
}

// TestLimits: a project's limits replace the host's.
func TestLimits(t *testing.T) {
	h, _ := newTestHost(t, mini(t), Options{Timeout: DefaultTimeout})
	ctx := ctxT(t)
	const p = "proj-limits"
	in := admission(t, session.CreateRequest{Tier: intp(1)})
	// 2M rounds take about 130 ms on a quiet machine of this kind: over the host's 20 ms, and
	// far under the project's 10 s (10M rounds, 650 ms, passed 10 s in two cold make tests).
	mustPut(t, h, p, "spin", spinPlugin(`{"allow":true}`, 2_000_000), 0, false)
	if d := one(t, decide(t, h, p, in)); d.Allow || d.Reasons[0] != "plugin spin: timed out after 20ms" {
		t.Fatalf("%+v", d)
	}
	if err := h.SetLimits(ctx, p, Limits{Timeout: MaxTimeout}); err != nil {
		t.Fatal(err)
	}
	if d := one(t, decide(t, h, p, in)); !d.Allow {
		t.Fatalf("%+v", d)
	}
	// A memory limit below what the module asks for: it no longer loads, and fails closed.
	bigMem := wmod{memMin: 20, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(resultAt0(14))}, data: []wdata{{0, []byte(`{"allow":true}`)}}}.encode()
	mustPut(t, h, p, "spin", bigMem, 0, false)
	if err := h.SetLimits(ctx, p, Limits{MemoryLimitPages: 10}); err != nil {
		t.Fatal(err)
	}
	if d := one(t, decide(t, h, p, in)); d.Allow || !strings.HasPrefix(d.Reasons[0], "plugin spin: could not be loaded") {
		t.Fatalf("%+v", d)
	}
	if _, err := h.Put(ctx, p, "spin", bigMem, []string{"admission"}, 0, false); !isInvalid(err, "does not compile") {
		t.Fatal(err)
	}
	for _, l := range []Limits{{MemoryLimitPages: maxPages + 1}, {Timeout: time.Microsecond}, {Timeout: time.Hour}} {
		if err := h.SetLimits(ctx, p, l); !isInvalid(err, "") {
			t.Fatalf("%+v: %v", l, err)
		}
	}
}

func TestCall(t *testing.T) {
	// A deadline where it is not the point: a cold run's Go guest call (its instance made
	// under -race, on a loaded machine) took past 1 s. The timeouts tested set their own.
	h, _ := newTestHost(t, nil, Options{Timeout: MaxTimeout})
	ctx := ctxT(t)
	in := admission(t, session.CreateRequest{Tier: intp(2), Template: "gpu", EndUserID: "bob"})
	d, took, err := h.Call(ctx, guests["allowlist"], in, WithConfig(map[string]string{"allowlist": "bob=gpu"}))
	if err != nil || !d.Allow || d.Decider != "plugin test" || took <= 0 {
		t.Fatalf("%+v %v %v", d, took, err)
	}
	d, _, err = h.Call(ctx, guests["allowlist"], in)
	if err != nil || d.Allow || !strings.Contains(d.Reasons[0], `template "gpu" is not on the allowlist for end user "bob" (allowed: tpl_base, tpl_dev_polyglot)`) {
		t.Fatalf("%+v %v", d, err)
	}
	_, _, err = h.Call(ctx, spinPlugin(`{"allow":true}`, 1<<30), in, WithLimits(Limits{Timeout: 20 * time.Millisecond}))
	var ce *CallError
	if !errors.As(err, &ce) || ce.Kind != FailTimeout || err.Error() != "timed out after 20ms" {
		t.Fatalf("%v", err)
	}
	_, _, err = h.Call(ctx, spinPlugin(`{"allow":true}`, 1<<30), in, WithLimits(Limits{Timeout: 5 * time.Millisecond}))
	if !errors.As(err, &ce) || err.Error() != "timed out after 5ms" {
		t.Fatalf("%v", err)
	}
	if _, _, err = h.Call(ctx, []byte("junk"), in); !isInvalid(err, "not a WebAssembly") {
		t.Fatal(err)
	}
	// config_get: a value longer than the SDK's first buffer, and a missing key.
	long := strings.Repeat("v", 5000)
	d, _, err = h.Call(ctx, guests["hostile"], admission(t, session.CreateRequest{Tier: intp(1), Template: "ok"}), WithConfig(map[string]string{"echo": long}))
	if err != nil || !d.Allow || !slices.Equal(d.Warnings, []string{"echo:" + long}) {
		t.Fatalf("%+v %v", d, err)
	}
}

// TestForget: a host whose own refresh would take an hour reads a project's set again at its
// next decision once told to Forget it (a gateway is told by store.Changes), and ForgetAll
// does the same for every project.
func TestForget(t *testing.T) {
	rdb := mini(t)
	a, _ := newTestHost(t, rdb, Options{})
	b, _ := newTestHost(t, rdb, Options{RefreshInterval: time.Hour})
	const p = "proj-forget"
	in := admission(t, session.CreateRequest{Tier: intp(1)})
	if ds := decide(t, b, p, in); len(ds) != 0 {
		t.Fatalf("%+v", ds)
	}
	mustPut(t, a, p, "deny", constPlugin(`{"allow":false,"reasons":["v1"]}`), 0, false)
	if ds := decide(t, b, p, in); len(ds) != 0 {
		t.Fatalf("b read the set again without being told: %+v", ds)
	}
	b.Forget(p)
	if ds := decide(t, b, p, in); len(ds) != 1 || !slices.Equal(ds[0].Reasons, []string{"v1"}) {
		t.Fatalf("after Forget: %+v", ds)
	}
	if err := a.Delete(ctxT(t), p, "deny"); err != nil {
		t.Fatal(err)
	}
	b.ForgetAll()
	if ds := decide(t, b, p, in); len(ds) != 0 {
		t.Fatalf("after ForgetAll: %+v", ds)
	}
}

// TestPluginCap: a project keeps at most MaxPlugins plugins and MaxTotalBytes of modules
// (a module shared by several names counts once); past either, a conflict that says what to
// do and stores nothing; replacing a plugin takes no room, deleting one makes room, and a
// project over the bytes may still shrink.
func TestPluginCap(t *testing.T) {
	rdb := mini(t)
	ctx := ctxT(t)
	mod := func(i int) []byte { return constPlugin(fmt.Sprintf(`{"allow":true,"warnings":["%d"]}`, i)) }
	h, _ := newTestHost(t, rdb, Options{MaxPlugins: 3})
	const p = "proj-cap"
	for i := range 3 {
		mustPut(t, h, p, fmt.Sprintf("p%d", i), mod(i), 0, false)
	}
	_, err := h.Put(ctx, p, "p3", mod(3), []string{session.PointAdmission}, 0, false)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "3 plugins") || !strings.Contains(err.Error(), "DELETE /v1/plugins/{name}") {
		t.Fatalf("a 4th plugin: %v", err)
	}
	if list, err := h.List(ctx, p); err != nil || len(list) != 3 {
		t.Fatalf("after the refusal: %d plugins, %v", len(list), err)
	}
	mustPut(t, h, p, "p0", mod(4), 0, false) // a new version of one takes no room
	mustPut(t, h, "proj-other", "p3", mod(3), 0, false)
	if err := h.Delete(ctx, p, "p1"); err != nil {
		t.Fatal(err)
	}
	mustPut(t, h, p, "p3", mod(3), 0, false)

	small := mod(0)
	h2, _ := newTestHost(t, rdb, Options{MaxTotalBytes: 2*len(small) + 4})
	const q = "proj-bytes"
	mustPut(t, h2, q, "a", mod(0), 0, false)
	mustPut(t, h2, q, "b", mod(1), 0, false)
	mustPut(t, h2, q, "c", mod(1), 0, false) // the same module as b: stored once
	_, err = h2.Put(ctx, q, "d", mod(2), []string{session.PointAdmission}, 0, false)
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "bytes of plugin modules") {
		t.Fatalf("a module past the bytes: %v", err)
	}
	mustPut(t, h2, q, "a", mod(2), 0, false) // replacing a's module frees a's bytes

	// A project already over the bytes (the cap lowered since): a put that shrinks or keeps
	// the total is taken, one that grows it is not.
	big := constPlugin(`{"allow":true,"warnings":["` + strings.Repeat("x", 4000) + `"]}`)
	h4, _ := newTestHost(t, rdb, Options{MaxTotalBytes: len(big) + 2*len(small)})
	const over = "proj-over"
	mustPut(t, h4, over, "big", big, 0, false)
	mustPut(t, h4, over, "a", mod(0), 0, false)
	h5, _ := newTestHost(t, rdb, Options{MaxTotalBytes: len(small)})
	mustPut(t, h5, over, "big", mod(5), 0, false) // shrinks: taken, though still over
	mustPut(t, h5, over, "a", mod(6), 0, false)   // the same size: taken
	_, err = h5.Put(ctx, over, "a", big, []string{session.PointAdmission}, 0, false)
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "bytes of plugin modules") {
		t.Fatalf("a put that grows a project over the bytes: %v", err)
	}

	h3, _ := newTestHost(t, rdb, Options{})
	if h3.o.MaxPlugins != DefaultMaxPlugins || h3.o.MaxTotalBytes != DefaultMaxTotalBytes {
		t.Fatalf("the defaults: %d plugins, %d bytes", h3.o.MaxPlugins, h3.o.MaxTotalBytes)
	}
}

// TestPluginCapConcurrent: plugins put at once, through several hosts (gateways), never pass
// the cap together.
func TestPluginCapConcurrent(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := ctxT(t)
	const p, max, tries = "proj-race", 3, 12
	hosts := make([]*Host, 3)
	for i := range hosts {
		hosts[i], _ = newTestHost(t, rdb, Options{MaxPlugins: max})
	}
	var wg sync.WaitGroup
	errs := make([]error, tries)
	for i := range tries {
		wg.Go(func() {
			wasm := constPlugin(fmt.Sprintf(`{"allow":true,"warnings":["%d"]}`, i))
			_, errs[i] = hosts[i%len(hosts)].Put(ctx, p, fmt.Sprintf("p%d", i), wasm, []string{session.PointAdmission}, 0, false)
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		var ce *store.ConflictError
		switch {
		case err == nil:
			ok++
		case !errors.As(err, &ce):
			t.Errorf("a put failed otherwise: %v", err)
		}
	}
	n, err := rdb.HLen(ctx, "wb:{"+p+"}:plugin:meta").Result()
	if err != nil || n != max || ok != max {
		t.Fatalf("%d plugins stored, %d puts answered OK; want %d (%v)", n, ok, max, err)
	}
}
