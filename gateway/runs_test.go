package gateway

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// TestRunsExpire: a run, output and all, is kept under a key of its own that expires with the
// retention of ended sessions (7 days), and GET answers it meanwhile. Before, every run of a
// project went into one hash with no TTL, up to 16 MiB of output each, for ever: a tenant
// looping POST /v1/runs filled the Redis that every tenant shares.
func TestRunsExpire(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	var run session.Run
	e.mustDo("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID, "command": "echo kept"}, 201, &run)
	var got session.Run
	e.mustDo("GET", "/v1/runs/"+run.ID, e.key, nil, 200, &got)
	if got.State != session.RunSucceeded || got.Stdout != "kept\n" {
		t.Fatalf("GET /v1/runs/%s: %+v", run.ID, got)
	}
	ctx := context.Background()
	keys, err := e.rdb.Keys(ctx, "*{"+e.projA+"}*").Result()
	if err != nil {
		t.Fatal(err)
	}
	const retention = 7 * 24 * time.Hour
	own := 0
	for _, key := range keys {
		ttl, err := e.rdb.TTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		holds := false
		switch typ, _ := e.rdb.Type(ctx, key).Result(); typ {
		case "string":
			holds = strings.HasSuffix(key, run.ID)
			if holds {
				own++
			}
		case "hash":
			holds, _ = e.rdb.HExists(ctx, key, run.ID).Result()
		case "zset":
			members, _ := e.rdb.ZRange(ctx, key, 0, -1).Result()
			holds = slices.Contains(members, run.ID)
		}
		if holds && (ttl <= 0 || ttl > retention) {
			t.Errorf("%s holds run %s with TTL %v, want it to expire within %v", key, run.ID, ttl, retention)
		}
	}
	if own != 1 {
		t.Errorf("%d keys of its own hold run %s, want 1 (with a TTL)", own, run.ID)
	}
}

// TestLegacyRunReadable: a run saved before each run had a key of its own (in the project's
// one hash of runs, as PutObject wrote it) is answered by GET /v1/runs/{id} again, and moved
// out of that hash to a key of its own. Before, GET answered 404.
func TestLegacyRunReadable(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sess, zero := "sess_legacy1", 0
	old := session.Run{ID: "run_legacy1", Object: "run", SessionID: &sess, State: session.RunSucceeded, ExitCode: &zero,
		Stdout: "old\n", CreatedAt: *session.At(time.Now().Add(-time.Hour)), FinishedAt: session.At(time.Now().Add(-time.Hour))}
	if err := e.st.PutObject(ctx, e.projA, "run", old.ID, old); err != nil {
		t.Fatal(err)
	}
	var got session.Run
	e.mustDo("GET", "/v1/runs/"+old.ID, e.key, nil, 200, &got)
	if got.State != old.State || got.Stdout != old.Stdout || got.FinishedAt == nil || !got.FinishedAt.Equal(old.FinishedAt.Time) {
		t.Errorf("GET of a run saved before runs had keys of their own: %+v, want %+v", got, old)
	}
	if keys, err := e.rdb.Keys(ctx, "*{"+e.projA+"}:obj:run").Result(); err != nil || len(keys) != 0 {
		t.Errorf("the old hash of runs is still there: %v %v", keys, err)
	}
	if e.runKeys() != 1 {
		t.Errorf("%d runs under keys of their own, want the one moved", e.runKeys())
	}
}

// TestAsyncRunAtClose: an async run cut short by its gateway's Close (a deploy) is recorded
// failed, with a message that says to run it again, and its run.finished event is sent. Before,
// the final write and the event went out on the cancelled context and failed: the run stayed
// "running" for ever and no webhook said otherwise.
func TestAsyncRunAtClose(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	var run session.Run
	e.mustDo("POST", "/v1/runs?wait=false", e.key, map[string]any{"session_id": s.ID, "command": "sleep 3"}, 202, &run)
	time.Sleep(500 * time.Millisecond)
	e.gw.Close()
	ctx := context.Background()
	got, err := e.st.GetRun(ctx, e.projA, run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != session.RunFailed || got.Error == nil || !strings.Contains(*got.Error, "shut down") || got.FinishedAt == nil {
		t.Errorf("run %s after its gateway closed: %s (error %v), want failed, saying the gateway shut down", run.ID, got.State, derefOr(got.Error))
	}
	evs, err := e.st.OutboxEvents(ctx, e.projA)
	if err != nil {
		t.Fatal(err)
	}
	var finished []string
	for _, ev := range evs {
		if ev.Type == session.EventRunFinished {
			finished = append(finished, string(ev.Object))
		}
	}
	if len(finished) != 1 || !strings.Contains(finished[0], `"state":"failed"`) {
		t.Errorf("run.finished events: %q, want one, of the failed run", finished)
	}
}

// derefOr is *p, or "<nil>".
func derefOr(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// TestEphemeralRunNotSavedStopsItsSession: an ephemeral run whose record cannot be saved
// (Redis failing) answers the error and ends the session admitted for it, which gives its
// slot back. Before, the session ran, holding a slot, until its idle timeout.
func TestEphemeralRunNotSavedStopsItsSession(t *testing.T) {
	rdb := redistest.Server(t)
	rdb.AddHook(failFirst{once: &sync.Once{}, contains: "}:run:", err: redisErr("READONLY You can't write against a read only replica.")})
	e := newEnvOn(t, rdb)
	r := e.do("POST", "/v1/runs", e.key, map[string]any{"tier": 1, "runtime": "python3", "code": "print(1)"})
	if code, _, msg := r.errorOf(t); r.status != 503 || code != "store_unavailable" {
		t.Fatalf("an ephemeral run whose record failed to save: %d %s %q, want 503 store_unavailable", r.status, code, msg)
	}
	e.waitNoSlots("the run's failed save", "the ephemeral session admitted for it was not stopped")
	var list struct{ Data []session.Session }
	e.mustDo("GET", "/v1/sessions", e.key, nil, 200, &list)
	if len(list.Data) != 1 || (list.Data[0].State != session.Stopping && list.Data[0].State != session.Stopped) {
		t.Fatalf("sessions after the run's failed save: %+v, want its one session stopping or stopped", list.Data)
	}
}

// failFirst fails the first command, alone or in a pipeline, with an argument that contains
// contains, with err, before it is sent.
type failFirst struct {
	once     *sync.Once
	contains string
	err      error
}

func (failFirst) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h failFirst) matches(cmds ...redis.Cmder) bool {
	hit := false
	for _, cmd := range cmds {
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, h.contains) {
				h.once.Do(func() { hit = true })
			}
		}
	}
	return hit
}

func (h failFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.matches(cmd) {
			cmd.SetErr(h.err)
			return h.err
		}
		return next(ctx, cmd)
	}
}

func (h failFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.matches(cmds...) {
			for _, cmd := range cmds {
				cmd.SetErr(h.err)
			}
			return h.err
		}
		return next(ctx, cmds)
	}
}

// TestRunOutputBudget: past a project's budget of stored output (runs' output and answers
// kept for Idempotency-Key replays) the oldest goes first: the run stays, its output dropped
// (output_expired, with its byte count); a replay dropped answers 409 replay_too_large,
// saying so. No run is refused. Before, a project stored up to 16 MiB a run for 7 days and
// 17 MiB a replay for a day, without bound.
func TestRunOutputBudget(t *testing.T) {
	const out = 40_000 // bytes each run writes
	e := newEnv(t, func(c *Config) { c.MaxStoredOutputBytes = 200 << 10 })
	s := e.running(map[string]any{"tier": 2})
	body := map[string]any{"session_id": s.ID, "command": "printf %40000s | tr ' ' x"}
	run := func(hdr ...string) session.Run {
		t.Helper()
		var r session.Run
		e.mustDo("POST", "/v1/runs", e.key, body, 201, &r, hdr...)
		if r.State != session.RunSucceeded || len(r.Stdout) != out {
			t.Fatalf("run %s: %s, %d bytes of output (error %s)", r.ID, r.State, len(r.Stdout), derefOr(r.Error))
		}
		return r
	}
	get := func(id string) session.Run {
		t.Helper()
		var r session.Run
		e.mustDo("GET", "/v1/runs/"+id, e.key, nil, 200, &r)
		return r
	}
	a := run()
	b := run("Idempotency-Key", "budget-b") // its output twice: the run's, and the answer kept
	c, d := run(), run()                    // 40 + 2×(40 + 53) + 40 KB: past 200 KiB, a goes
	if got := get(a.ID); !got.OutputExpired || got.Stdout != "" || got.StdoutBytes != out || !got.Truncated || got.State != session.RunSucceeded {
		t.Errorf("the oldest run past the budget: expired %v, %d bytes of %d kept, state %s; want its output dropped, its count kept",
			got.OutputExpired, len(got.Stdout), got.StdoutBytes, got.State)
	}
	for _, r := range []session.Run{b, c, d} {
		if got := get(r.ID); got.OutputExpired || len(got.Stdout) != out {
			t.Errorf("run %s: output dropped (%v, %d bytes) within the budget", r.ID, got.OutputExpired, len(got.Stdout))
		}
	}
	run()
	run() // b's run, then b's answer go
	if got := get(b.ID); !got.OutputExpired {
		t.Errorf("run %s kept its output past the budget", b.ID)
	}
	r := e.do("POST", "/v1/runs", e.key, body, "Idempotency-Key", "budget-b")
	if msg := expectError(t, r, 409, "replay_too_large", ""); !strings.Contains(msg, "budget") || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the replay of a dropped answer: %q (replayed %q), want one that names the budget", msg, r.header.Get("Idempotent-Replayed"))
	}
}

// TestRunStalledCallerIsCut: a run's answer (its output, up to MaxOutputBytes a stream: here
// 16 MB of JSON), read by GET or replayed for an Idempotency-Key, whose caller stays
// connected but takes none of it ends once a write to it waited WriteStall, which lets go of
// the handler and the answer's megabytes (the call is counted in /metrics as it ends); the
// first answer, cut off so, is replayed as cut off (replay_incomplete), not as the bytes
// taken. Before, such a caller (asking for a few on one connection) held both for as long as
// it stayed.
func TestRunStalledCallerIsCut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WriteStall = 3 * time.Second })
	s := e.running(map[string]any{"tier": 2})
	var run session.Run
	body := `{"session_id":"` + s.ID + `","command":"head -c 8000000 /dev/zero | tr '\\0' y; head -c 8000000 /dev/zero | tr '\\0' n >&2"}`
	e.mustDo("POST", "/v1/runs", e.key, []byte(body), 201, &run, "Idempotency-Key", "big")
	addr := e.srv.Listener.Addr().String()
	stalledRead(t, addr, e.key, "/v1/runs/"+run.ID, 3)
	e.waitCounted("GET /v1/runs/{id}", 200, 1, "a GET of a run")
	stalledCall(t, addr, e.key, "POST", "/v1/runs", "Content-Type: application/json\r\nIdempotency-Key: big\r\n", body, 3)
	e.waitCounted("POST /v1/runs", 201, 2, "a replay of a run's answer")
	// The first answer, cut off so: its retry learns that, and is not run again.
	stalledCall(t, addr, e.key, "POST", "/v1/runs", "Content-Type: application/json\r\nIdempotency-Key: cut\r\n", body, 1)
	e.waitCounted("POST /v1/runs", 201, 3, "a run's answer")
	expectError(t, e.do("POST", "/v1/runs", e.key, []byte(body), "Idempotency-Key", "cut"), 409, "replay_incomplete", "")
}

// TestWaitRunningSpacesItsLooks: a run's wait for its session's cold start (1.5 s here) looks
// at the session often at first, for a warm guest, and then spaced out: every look is a Redis
// read. At every 5 ms a wait of 1.5 s took about 340 looks; spaced, about 110, and the start
// is still seen within runPollMax. A look reads the session's state alone, and the whole
// session (its HGETALL and decoding) is read once, when it runs.
func TestWaitRunningSpacesItsLooks(t *testing.T) {
	rdb := redistest.Server(t)
	var looks, whole atomic.Int64
	rdb.AddHook(countLooks{n: &looks, whole: &whole})
	st := store.New(rdb)
	ctx := context.Background()
	p, _, err := st.CreateProject(ctx, "wait")
	if err != nil {
		t.Fatal(err)
	}
	id := session.NewID("sess_", time.Now())
	sess := &session.Session{ID: id, Tier: 1, State: session.Pending, ProjectID: p.ID, Template: "tpl_base@sha256:aaaa",
		Region: "local", IdleTimeoutS: 300, MaxLifetimeS: 3600, CreatedAt: *session.At(time.Now())}
	if _, err := st.Create(ctx, sess, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition(ctx, store.Change{Project: p.ID, ID: id, From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "node_a"}); err != nil {
		t.Fatal(err)
	}
	const coldStart = 1500 * time.Millisecond
	ran := make(chan time.Time, 1)
	go func() {
		time.Sleep(coldStart)
		ran <- time.Now()
		if _, err := st.Transition(ctx, store.Change{Project: p.ID, ID: id, From: session.Provisioning, To: session.Running, Driver: session.Node}); err != nil {
			t.Error(err)
		}
	}()
	s := &Server{Config: Config{Store: st, Tiers: session.DefaultTiers()}}
	looks.Store(0)
	whole.Store(0)
	got, err := s.waitRunning(ctx, sess)
	seen := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if got.State != session.Running {
		t.Fatalf("waitRunning answered a session %s", got.State)
	}
	if n := looks.Load(); n > 170 {
		t.Errorf("waitRunning looked at the session %d times in a cold start of %s, want at most 170", n, coldStart)
	}
	// A look reads the state alone: the whole session (its HGETALL and decoding) once it runs.
	if n := whole.Load(); n != 1 {
		t.Errorf("waitRunning read the whole session %d times in %d looks, want once (when it ran)", n, looks.Load())
	}
	// Wide: the bound is runPollMax, but a loaded machine delays the timer and the read.
	t.Logf("%d looks", looks.Load())
	if late := seen.Sub(<-ran); late > time.Second {
		t.Errorf("waitRunning saw the session running %s after it was", late)
	}
}

// countLooks counts the HGETALL and HGET commands its client sends (Store.Get's and
// Store.States', a look at a session's state), pipelined or not.
type countLooks struct{ n, whole *atomic.Int64 } // whole: the HGETALLs alone (nil: not counted)

func (countLooks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countLooks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h countLooks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}

func (h countLooks) count(cmd redis.Cmder) {
	switch cmd.Name() {
	case "hgetall":
		if h.whole != nil {
			h.whole.Add(1)
		}
		h.n.Add(1)
	case "hget":
		h.n.Add(1)
	}
}
