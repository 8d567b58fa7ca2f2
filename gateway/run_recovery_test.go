package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
	"wb/store"
)

// killAt is a hook that, from the first command match accepts (or once kill is called),
// fails every command of its client as a connection reset would: the gateway whose store
// uses it is dead to Redis, and so to every other gateway, though its goroutines go on.
func killAt(match func(redis.Cmder) bool) (hook processHook, kill func()) {
	var dead atomic.Bool
	hook = func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if match != nil && match(cmd) {
			dead.Store(true)
		}
		if dead.Load() {
			return resetError(cmd)
		}
		return next(ctx, cmd)
	}
	return hook, func() { dead.Store(true) }
}

// startingRun matches the write that records a run running, just before its command starts.
func startingRun(cmd redis.Cmder) bool {
	if !scriptWith(cmd, "}:run:") {
		return false
	}
	for _, a := range cmd.Args() {
		if a == "start" {
			return true
		}
	}
	return false
}

// waitRun polls the run through e until it has ended.
func (e *env) waitRun(id string) session.Run {
	e.t.Helper()
	var run session.Run
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		e.mustDo("GET", "/v1/runs/"+id, e.key, nil, 200, &run)
		if runEnded(run.State) {
			return run
		}
	}
	e.t.Fatalf("run %s is still %s", id, run.State)
	return run
}

// finishedRuns answers the run.finished events of the project's outbox, by run id.
func (e *env) finishedRuns() map[string][]string {
	e.t.Helper()
	evs, err := e.st.OutboxEvents(context.Background(), e.projA)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string][]string{}
	for _, ev := range evs {
		if ev.Type == session.EventRunFinished {
			var run session.Run
			_ = json.Unmarshal(ev.Object, &run)
			out[run.ID] = append(out[run.ID], run.State)
		}
	}
	return out
}

// TestRunSurvivesItsGateway: an async run whose gateway died (cut off from Redis, never
// closed) before it recorded the run's end is found by another gateway once its lease runs
// out, and recorded failed with a message that says to run it again, with its run.finished.
// One queued when its gateway died never starts its command; an ephemeral one's session is
// stopped. Before, each stayed queued or running for ever, with no event.
func TestRunSurvivesItsGateway(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	for _, c := range []struct {
		name      string
		body      map[string]any
		killAt    func(redis.Cmder) bool // nil: once the run is running
		ephemeral bool
	}{
		{"queued", map[string]any{"session_id": s.ID, "command": "echo ran"}, startingRun, false},
		{"running", map[string]any{"session_id": s.ID, "command": "sleep 2; echo ran"}, nil, false},
		{"ephemeral queued", map[string]any{"tier": 1, "runtime": "sh", "code": "echo ran"}, startingRun, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := e.in(t)
			hook, kill := killAt(c.killAt)
			_, dying := e.gatewayWith(hook, func(c *Config) { c.WorkLease = time.Second })
			var run session.Run
			dying.mustDo("POST", "/v1/runs?wait=false", e.key, c.body, 202, &run)
			sessID := *run.SessionID
			execs := e.execsIn(sessID)
			if c.killAt == nil {
				for deadline := time.Now().Add(time.Minute); run.State != session.RunRunning; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("run %s is %s, never running", run.ID, run.State)
					}
					e.mustDo("GET", "/v1/runs/"+run.ID, e.key, nil, 200, &run)
				}
				kill()
			}
			got := e.waitRun(run.ID)
			if got.State != session.RunFailed || got.Error == nil || *got.Error != orphanRunMessage || got.FinishedAt == nil {
				t.Errorf("run %s after its gateway died: %s (error %s), want failed: %q", run.ID, got.State, derefOr(got.Error), orphanRunMessage)
			}
			if ev := e.finishedRuns()[run.ID]; len(ev) != 1 || ev[0] != session.RunFailed {
				t.Errorf("run.finished events of run %s: %v, want one, failed", run.ID, ev)
			}
			if c.killAt != nil {
				if got.StartedAt != nil || e.execsIn(sessID) != execs {
					t.Errorf("run %s, queued when its gateway died, started (at %v; %d commands in its session)", run.ID, got.StartedAt, e.execsIn(sessID)-execs)
				}
			}
			if c.ephemeral {
				e.waitState(e.key, sessID, session.Stopped)
			}
			// The recovering gateway lets go of its claim just after it records the run failed,
			// which this test may see first (a loaded cold make test did: the claim's lease_
			// token was left): given a while.
			due, _, err := e.st.DueRunWork(context.Background(), time.Now().Add(time.Hour), 10)
			for deadline := time.Now().Add(30 * time.Second); (err != nil || len(due) != 0) && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond)
				due, _, err = e.st.DueRunWork(context.Background(), time.Now().Add(time.Hour), 10)
			}
			if err != nil || len(due) != 0 {
				t.Errorf("run leases left 30 s after the recovery: %v %v", due, err)
			}
		})
	}
}

// TestRunRetryAfterItsGatewayDied: a client whose run's gateway died mid-run retries with its
// Idempotency-Key on another gateway; the retry waits for the recovery to end the run and
// answers it failed, with the message to run it again. Before, the retry answered the run
// running, and it stayed so.
func TestRunRetryAfterItsGatewayDied(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	hook, kill := killAt(nil)
	_, dying := e.gatewayWith(hook, func(c *Config) { c.WorkLease = time.Second }, store.WithIdemLease(time.Second))
	body := []byte(`{"session_id":"` + s.ID + `","command":"sleep 2; echo ran"}`)
	go dying.do("POST", "/v1/runs", e.key, body, "Idempotency-Key", "dies-mid-run")
	var run session.Run
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		keys, err := e.rdb.Keys(context.Background(), "*{"+e.projA+"}:run:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 1 {
			e.mustDo("GET", "/v1/runs/"+keys[0][strings.LastIndex(keys[0], ":")+1:], e.key, nil, 200, &run)
			if run.State == session.RunRunning {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the run never ran")
		}
	}
	kill()
	// A client that gives up, so that a retry waiting for ever fails the test rather than
	// hang it (the test server's Close waits for its requests).
	client := &http.Client{Timeout: 2 * time.Minute}
	var status int
	var answer []byte
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequest("POST", e.url+"/v1/runs", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Idempotency-Key", "dies-mid-run")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("the retry: %v", err)
		}
		answer, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if status = resp.StatusCode; status != 409 || time.Now().After(deadline) {
			break
		}
	}
	r := response{status: status, body: answer}
	var got session.Run
	if r.status != 201 || json.Unmarshal(r.body, &got) != nil {
		t.Fatalf("the retry: %d %s", r.status, r.body)
	}
	if got.ID != run.ID || got.State != session.RunFailed || derefOr(got.Error) != orphanRunMessage {
		t.Errorf("the retry answered run %s %s (error %s), want %s failed: %q", got.ID, got.State, derefOr(got.Error), run.ID, orphanRunMessage)
	}
}

// partition is a hook that, from cut until heal, holds every command of its client (those
// under way when cut included) until heal or its context ends: a gateway alive throughout,
// cut off from Redis as a partition does (its commands hang, then go through).
func partition() (hook processHook, cut, heal func()) {
	var mu sync.Mutex
	var healed chan struct{} // nil: not cut
	hook = func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		mu.Lock()
		h := healed
		mu.Unlock()
		if h != nil {
			select {
			case <-h:
			case <-ctx.Done():
				cmd.SetErr(ctx.Err())
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
	cut = func() {
		mu.Lock()
		defer mu.Unlock()
		if healed == nil {
			healed = make(chan struct{})
		}
	}
	heal = func() {
		mu.Lock()
		defer mu.Unlock()
		if healed != nil {
			close(healed)
			healed = nil
		}
	}
	return hook, cut, heal
}

// TestRunEndsOnceWhenItsGatewayComesBack: a gateway cut off from Redis mid-run (alive, never
// closed) for longer than its lease loses the run to another gateway's recovery, which
// records it failed with its run.finished (and stops an ephemeral run's session, under the
// command). When the first gateway regains Redis and comes to record the run's end, the
// recovery's stands: the record stays as the recovery wrote it, no second run.finished goes
// out, and the first gateway answers its caller the run as recorded. Before, it wrote its own
// end over the recovery's and announced a second, contradicting the first.
func TestRunEndsOnceWhenItsGatewayComesBack(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	for _, c := range []struct {
		name      string
		body      map[string]any
		ephemeral bool
	}{
		{"in a session", map[string]any{"session_id": s.ID, "command": "sleep 3; echo ran"}, false},
		{"ephemeral", map[string]any{"tier": 1, "runtime": "sh", "code": "sleep 3; echo ran"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := e.in(t)
			ctx := context.Background()
			before, err := e.rdb.Keys(ctx, "*{"+e.projA+"}:run:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			hook, cut, heal := partition()
			defer heal()
			_, cutOff := e.gatewayWith(hook, func(c *Config) { c.WorkLease = time.Second })
			answer := make(chan response, 1)
			go func() { answer <- cutOff.do("POST", "/v1/runs", e.key, c.body) }()
			var run session.Run
			for deadline := time.Now().Add(time.Minute); run.State != session.RunRunning; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the run never ran")
				}
				keys, err := e.rdb.Keys(ctx, "*{"+e.projA+"}:run:*").Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range keys {
					if !slices.Contains(before, k) {
						e.mustDo("GET", "/v1/runs/"+k[strings.LastIndex(k, ":")+1:], e.key, nil, 200, &run)
					}
				}
			}
			cut()
			recovered := e.waitRun(run.ID) // by this env's gateway, once the cut one's lease ran out
			if recovered.State != session.RunFailed || derefOr(recovered.Error) != orphanRunMessage {
				t.Fatalf("run %s after its gateway was cut off: %s (error %s), want failed: %q", run.ID, recovered.State, derefOr(recovered.Error), orphanRunMessage)
			}
			if c.ephemeral {
				e.waitState(e.key, *run.SessionID, session.Stopped)
			}
			heal()
			a := <-answer
			var answered session.Run
			if a.status != 201 || json.Unmarshal(a.body, &answered) != nil || answered.ID != run.ID ||
				answered.State != session.RunFailed || derefOr(answered.Error) != orphanRunMessage {
				t.Errorf("the cut-off gateway answered %d %s, want run %s as the recovery recorded it", a.status, a.body, run.ID)
			}
			var got session.Run
			e.mustDo("GET", "/v1/runs/"+run.ID, e.key, nil, 200, &got)
			if got.State != session.RunFailed || derefOr(got.Error) != orphanRunMessage || got.Stdout != "" {
				t.Errorf("run %s once its gateway came back: %s %q (error %s), want the recovery's end", run.ID, got.State, got.Stdout, derefOr(got.Error))
			}
			if ev := e.finishedRuns()[run.ID]; len(ev) != 1 || ev[0] != session.RunFailed {
				t.Errorf("run.finished events of run %s: %v, want one, failed", run.ID, ev)
			}
		})
	}
}

// TestRunRecoveryReadsEveryLeaseSet: the leases of runs whose gateway died are spread over
// the shards of the runs' lease set, and the recovery finds them in every shard, and in the
// lease set of before the shards, which an older gateway still writes during a rolling
// deploy: each run is recorded failed, with one run.finished, and no lease is left. Before,
// every run's lease was in the one key "wb:{runs}:work", which every run of the fleet wrote.
func TestRunRecoveryReadsEveryLeaseSet(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	now := time.Now()
	var ids []string
	// A dead gateway's runs, running, with leases that ran out (as store.SetRunWork left them).
	for i := range 8 {
		ref := store.RunRef{Project: e.projA, ID: session.NewID("run_", now), Attempt: session.NewID("lease_", now)}
		if err := e.st.SetRunWork(ctx, ref, now.Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
		run := &session.Run{ID: ref.ID, Object: "run", State: session.RunRunning, CreatedAt: *session.At(now), StartedAt: session.At(now)}
		if created, err := e.st.CreateRun(ctx, e.projA, run, ref.Attempt); err != nil || !created {
			t.Fatalf("run %d: %v %v", i, created, err)
		}
		ids = append(ids, ref.ID)
	}
	shards := 0
	for i := range 16 {
		if n, err := e.rdb.ZCard(ctx, fmt.Sprintf("wb:{runs.%d}:work", i)).Result(); err != nil {
			t.Fatal(err)
		} else if n > 0 {
			shards++
		}
	}
	if shards < 2 {
		t.Errorf("the leases of %d runs are in %d shard keys, want several", len(ids), shards)
	}
	// An older gateway's run, leased as it leases them, in the key of before the shards.
	old := store.RunRef{Project: e.projA, ID: session.NewID("run_", now), Attempt: session.NewID("lease_", now)}
	oldRun := &session.Run{ID: old.ID, Object: "run", State: session.RunQueued, CreatedAt: *session.At(now)}
	if created, err := e.st.CreateRun(ctx, e.projA, oldRun, old.Attempt); err != nil || !created {
		t.Fatalf("the older gateway's run: %v %v", created, err)
	}
	member := old.Project + "/" + old.ID + "/" + old.Attempt
	if err := e.rdb.ZAdd(ctx, "wb:{runs}:work", redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: member}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.HSet(ctx, "wb:{runs}:worker", member, old.Attempt).Err(); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, old.ID)

	for _, id := range ids {
		got := e.waitRun(id)
		if got.State != session.RunFailed || derefOr(got.Error) != orphanRunMessage {
			t.Errorf("run %s after its gateway died: %s (error %s), want failed: %q", id, got.State, derefOr(got.Error), orphanRunMessage)
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		due, _, err := e.st.DueRunWork(ctx, time.Now().Add(time.Hour), 100)
		legacy, lerr := e.rdb.ZCard(ctx, "wb:{runs}:work").Result()
		if err == nil && lerr == nil && len(due) == 0 && legacy == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run leases left after the recovery: %v, %d in the key of before the shards (%v, %v)", due, legacy, err, lerr)
		}
	}
	finished := e.finishedRuns()
	for _, id := range ids {
		if ev := finished[id]; len(ev) != 1 || ev[0] != session.RunFailed {
			t.Errorf("run.finished events of run %s: %v, want one, failed", id, ev)
		}
	}
}
