package store

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
)

// TestSignals: a signal reaches one consumer of a group, a blocking read wakes on a signal
// sent while it waits, an unacknowledged signal is read again by its consumer, and an
// acknowledged one is gone.
func TestSignals(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			s := New(b.New(t))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			// Nothing waiting: a read with no wait answers nothing at once.
			got, err := s.Signals(ctx, WorkOutbox, "g", "c1", 0, 10)
			if err != nil || len(got) != 0 {
				t.Fatalf("empty: %v %v", got, err)
			}
			// A blocking read wakes on a signal sent while it waits.
			done := make(chan []Signal, 1)
			go func() {
				got, err := s.Signals(ctx, WorkOutbox, "g", "c1", 20*time.Second, 10)
				if err != nil {
					t.Error(err)
				}
				done <- got
			}()
			time.Sleep(100 * time.Millisecond) // let the read block; a signal before it is read just as well
			if err := s.Signal(ctx, WorkOutbox, "proj_a"); err != nil {
				t.Fatal(err)
			}
			select {
			case got = <-done:
			case <-ctx.Done():
				t.Fatal("the blocking read did not wake")
			}
			if len(got) != 1 || got[0].Project != "proj_a" {
				t.Fatalf("woken with %v", got)
			}
			// Other kinds of work have their own stream.
			if other, err := s.Signals(ctx, WorkUsage, "g", "c1", 0, 10); err != nil || len(other) != 0 {
				t.Fatalf("usage signals: %v %v", other, err)
			}
			// Unacknowledged: the same consumer reads it again (it restarted mid-work).
			again, err := s.Signals(ctx, WorkOutbox, "g", "c1", 0, 10)
			if err != nil || len(again) != 1 || again[0].ID != got[0].ID {
				t.Fatalf("unacknowledged signal read again: %v %v", again, err)
			}
			if err := s.AckSignals(ctx, WorkOutbox, "g", again); err != nil {
				t.Fatal(err)
			}
			if after, err := s.Signals(ctx, WorkOutbox, "g", "c1", 0, 10); err != nil || len(after) != 0 {
				t.Fatalf("after ack: %v %v", after, err)
			}
			// A burst of one project is one project to handle.
			for _, p := range []string{"proj_b", "proj_c", "proj_b", "proj_b"} {
				if err := s.Signal(ctx, WorkPending, p); err != nil {
					t.Fatal(err)
				}
			}
			burst, err := s.Signals(ctx, WorkPending, "g", "c2", 0, 10)
			if err != nil || len(burst) != 4 {
				t.Fatalf("burst: %v %v", burst, err)
			}
			if ps := SignalProjects(burst); !slices.Equal(ps, []string{"proj_b", "proj_c"}) {
				t.Fatalf("projects of the burst: %v", ps)
			}
		})
	}
}

// TestWritesSignal: every write that makes background work signals it: a create (pending, and
// outbox when its project has a webhook endpoint), a transition (outbox), an event (outbox), a
// usage record (usage).
func TestWritesSignal(t *testing.T) {
	t.Parallel()
	s := New(redistest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const project = "proj_sig"
	read := func(w Work) []string { return takeSignals(t, ctx, s, w) }
	// A project with no webhook endpoint: its session.pending event would be skipped unread
	// (the outbox's only reader delivers to the endpoints there are when it reads), so a
	// create writes none, and signals no outbox work.
	sess, err := s.Create(ctx, newPending(project, ""), 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(WorkPending); !slices.Equal(got, []string{project}) {
		t.Fatalf("pending signals after a create: %v", got)
	}
	if got := read(WorkOutbox); len(got) != 0 {
		t.Fatalf("outbox signals after a create in a project with no webhook endpoint: %v; want none", got)
	}
	if n, err := s.rdb.XLen(ctx, Outbox(project)).Result(); err != nil || n != 0 {
		t.Fatalf("the outbox of a project with no webhook endpoint holds %d events after a create (%v); want none", n, err)
	}
	if _, err := s.Transition(ctx, Change{Project: project, ID: sess.ID, From: "pending", To: "failed",
		Driver: "timer", Reason: "provision_timeout", Version: 1}); err != nil {
		t.Fatal(err)
	}
	read(WorkOutbox)
	withEndpoint(t, s, project)
	if sess, err = s.Create(ctx, newPending(project, ""), 10); err != nil {
		t.Fatal(err)
	}
	if got := read(WorkPending); !slices.Equal(got, []string{project}) {
		t.Fatalf("pending signals after a create: %v", got)
	}
	if got := read(WorkOutbox); !slices.Equal(got, []string{project}) {
		t.Fatalf("outbox signals after a create: %v", got)
	}
	if evs, err := s.OutboxEvents(ctx, project); err != nil || len(evs) == 0 || evs[len(evs)-1].Type != session.EventPending || evs[len(evs)-1].SessionID != sess.ID {
		t.Fatalf("the outbox after a create in a project with a webhook endpoint: %+v, %v; want its session.pending last", evs, err)
	}
	if _, err := s.Transition(ctx, Change{Project: project, ID: sess.ID, From: "pending", To: "failed",
		Driver: "timer", Reason: "provision_timeout", Version: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, project, "snapshot.ready", sess.ID, map[string]string{"id": "snap_1"}); err != nil {
		t.Fatal(err)
	}
	if got := read(WorkOutbox); !slices.Equal(got, []string{project, project}) {
		t.Fatalf("outbox signals after a transition and an event: %v", got)
	}
	if err := s.AppendUsage(ctx, project, []any{"session_id", sess.ID, "seq", 1}); err != nil {
		t.Fatal(err)
	}
	if got := read(WorkUsage); !slices.Equal(got, []string{project}) {
		t.Fatalf("usage signals after a record: %v", got)
	}
	if got := read(WorkPending); len(got) != 0 {
		t.Fatalf("pending signals nobody made: %v", got)
	}
}

// TestSignalsEndWithContext: a worker asked to stop while it waits for signals stops at
// once, not when its wait passes, and loses no signal the abandoned read took.
func TestSignalsEndWithContext(t *testing.T) {
	t.Parallel()
	s := New(redistest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Signals(wctx, WorkUsage, "g", "c", 2*time.Second, 10)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // let the read block
	stopped := time.Now()
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("read after its context ended: %v", err)
	}
	if d := time.Since(stopped); d > time.Second {
		t.Fatalf("the read ended %v after its context, want at once", d)
	}
	// A signal the abandoned read takes stays this consumer's, unacknowledged.
	if err := s.Signal(ctx, WorkUsage, "proj_a"); err != nil {
		t.Fatal(err)
	}
	for {
		got, err := s.Signals(ctx, WorkUsage, "g", "c", 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 1 && got[0].Project == "proj_a" {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("the signal was lost")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestForgetIdleConsumers: a consumer silent for longer than the age with nothing pending is
// removed; one with a signal pending, and one heard from since, stay.
func TestForgetIdleConsumers(t *testing.T) {
	t.Parallel()
	rdb := redistest.Server(t)
	s := New(rdb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const age = 300 * time.Millisecond
	if err := s.ForgetIdleConsumers(ctx, WorkUsage, "g", age); err != nil {
		t.Fatalf("no stream yet: %v", err)
	}
	read := func(c string, ack bool) {
		t.Helper()
		if err := s.Signal(ctx, WorkUsage, "proj_"+c); err != nil {
			t.Fatal(err)
		}
		sigs, err := s.Signals(ctx, WorkUsage, "g", c, 0, 1)
		if err != nil || len(sigs) != 1 {
			t.Fatalf("%s: %v %v", c, sigs, err)
		}
		if ack {
			if err := s.AckSignals(ctx, WorkUsage, "g", sigs); err != nil {
				t.Fatal(err)
			}
		}
	}
	read("gone", true)
	read("busy", false)
	time.Sleep(2 * age)
	read("recent", true)
	if err := s.ForgetIdleConsumers(ctx, WorkUsage, "g", age); err != nil {
		t.Fatal(err)
	}
	consumers, err := rdb.XInfoConsumers(ctx, signalKey(WorkUsage), "g").Result()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range consumers {
		names = append(names, c.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"busy", "recent"}) {
		t.Fatalf("consumers left: %v; want busy (a signal pending) and recent", names)
	}
}

// TestSignalsWaitUnderAMillisecond: a wait shorter than Redis's unit ends about when it
// should. go-redis sends BLOCK in whole milliseconds, and BLOCK 0 blocks for ever: a placer
// whose next deadline was 400 µs away waited out the client's socket timeout (10 s) instead.
func TestSignalsWaitUnderAMillisecond(t *testing.T) {
	t.Parallel()
	s := New(redistest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, wait := range []time.Duration{time.Nanosecond, 400 * time.Microsecond, 999 * time.Microsecond} {
		start := time.Now()
		if got, err := s.Signals(ctx, WorkPending, "g", "c", wait, 10); err != nil || len(got) != 0 {
			t.Fatalf("wait %v: %v %v", wait, got, err)
		}
		if _, _, err := s.TailSignals(ctx, WorkPending, "", wait, 10); err != nil {
			t.Fatalf("tail, wait %v: %v", wait, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("a wait of %v took %v", wait, d)
		}
	}
}

// takeSignals reads and acknowledges the signals of w waiting for the tests' consumer, and
// answers their projects.
func takeSignals(t *testing.T, ctx context.Context, s *Store, w Work) []string {
	t.Helper()
	sigs, err := s.Signals(ctx, w, "test", "c", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AckSignals(ctx, w, "test", sigs); err != nil {
		t.Fatal(err)
	}
	var ps []string
	for _, sg := range sigs {
		ps = append(ps, sg.Project)
	}
	return ps
}

// countedStore is a Store over a new client of b whose round trips rt counts, and how many a
// create's or a placement's write takes there: one on one Redis, two on a Cluster (whose
// global keys are in other slots than the project's).
func countedStore(t *testing.T, b redistest.Backend) (s *Store, rt *redistest.RoundTrips, oneWrite int64) {
	rdb := b.New(t)
	rt = redistest.CountRoundTrips(rdb)
	oneWrite = 1
	if _, cluster := rdb.(*redis.ClusterClient); cluster {
		oneWrite = 2
	}
	return New(rdb), rt, oneWrite
}

// TestSignalMaxLen: the scripts that signal (signal_created, the transition script) trim the
// streams to the bound Signal does.
func TestSignalMaxLen(t *testing.T) {
	t.Parallel()
	if strconv.Itoa(signalMaxLen) != signalMaxLenLua {
		t.Fatalf("signalMaxLen %d, the scripts' %s", signalMaxLen, signalMaxLenLua)
	}
}

// tripCounter counts a client's round trips.
type tripCounter struct{ n atomic.Int64 }

func (c *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(1); return next(ctx, cmds) }
}

// TestSignalsTwoTrips: a read of signals costs two round trips, what a worker pays per wake:
// one for its own unacknowledged and the claimable signals, one for the wait; and a read
// made before any group exists makes it, and still answers its own unacknowledged signals
// first.
func TestSignalsTwoTrips(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.New(t)
			cnt := &tripCounter{}
			rdb.AddHook(cnt)
			s := New(rdb)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for i := range 2 { // the first makes the group (and loads the script: not counted)
				before := cnt.n.Load()
				got, err := s.Signals(ctx, WorkUsage, "g", "c", 10*time.Millisecond, 10)
				if err != nil || len(got) != 0 {
					t.Fatalf("read %d: %v %v", i, got, err)
				}
				if n := cnt.n.Load() - before; i > 0 && n > 2 {
					t.Errorf("a read with nothing to read took %d round trips, want at most 2", n)
				}
			}
			if err := s.Signal(ctx, WorkUsage, "proj_a"); err != nil {
				t.Fatal(err)
			}
			first, err := s.Signals(ctx, WorkUsage, "g", "c", 10*time.Millisecond, 10)
			if err != nil || len(first) != 1 || first[0].Project != "proj_a" {
				t.Fatalf("the signal: %v %v", first, err)
			}
			before := cnt.n.Load()
			again, err := s.Signals(ctx, WorkUsage, "g", "c", 10*time.Millisecond, 10)
			if err != nil || !slices.Equal(again, first) {
				t.Fatalf("unacknowledged, read again: %v %v, want %v", again, err, first)
			}
			if n := cnt.n.Load() - before; n != 1 {
				t.Errorf("reading an unacknowledged signal again took %d round trips, want 1", n)
			}
		})
	}
}
