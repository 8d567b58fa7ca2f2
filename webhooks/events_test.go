package webhooks

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
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

// sweepDone makes d report the end of each sweep on the returned channel (the first one is
// at start).
func sweepDone(d *Dispatcher) <-chan struct{} {
	ch := make(chan struct{}, 100)
	d.swept = func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return ch
}

func await(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestPromptDelivery: with the default options, an event reaches its endpoint as soon as it
// is written: the dispatcher waits on the outbox signals, not on a poll interval.
func TestPromptDelivery(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "prompt")
	rcv := newReceiver(t, nil)
	createEndpoint(t, reg, project, rcv, AllEvents)
	d := NewDispatcher(rdb, reg, Options{Logger: slog.New(slog.DiscardHandler)})
	swept := sweepDone(d)
	runDispatcher(t, d)
	await(t, "the start sweep", swept)

	for i := range 3 {
		start := time.Now()
		if _, err := runSession(st, project, 0); err != nil { // session.pending
			t.Fatal(err)
		}
		waitFor(t, "the event", func() bool { return len(rcv.succeeded()) > i })
		// A generous bound for a loaded machine, far below the longest wait (maxWait) of an
		// idle dispatcher.
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("event %d delivered %v after its write", i, took)
		}
	}
}

// TestRetryOnTime: a failed delivery is attempted again at its due time, with nothing else
// happening meanwhile: the dispatcher waits for the earliest due delivery of the global due
// set, not for the next signal or sweep.
func TestRetryOnTime(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "retry")
	var times []time.Time
	var mu sync.Mutex
	rcv := newReceiver(t, func(n int, _ string) int {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if n == 0 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	createEndpoint(t, reg, project, rcv, AllEvents)
	const backoff = 1500 * time.Millisecond
	opts := fastOptions("t1")
	opts.Backoff = func(int) time.Duration { return backoff }
	startDispatcher(t, rdb, opts)
	if _, err := runSession(st, project, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the retry to succeed", func() bool { return len(rcv.succeeded()) == 1 })
	mu.Lock()
	defer mu.Unlock()
	if len(times) != 2 {
		t.Fatalf("%d attempts, want 2", len(times))
	}
	gap := times[1].Sub(times[0])
	if gap < backoff-50*time.Millisecond || gap > backoff+5*time.Second {
		t.Errorf("retried %v after the failure, due %v after it", gap, backoff)
	}
}

// countingTransport counts the requests a dispatcher makes.
type countingTransport struct {
	n    atomic.Int32
	base http.RoundTripper
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.RoundTrip(r)
}

// TestDispatchersShareProjects: two dispatchers share the signals of many projects; every
// event arrives once, in order per session, and both do part of the work.
func TestDispatchersShareProjects(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	const projects = 20
	ids := make([]string, projects)
	rcvs := make([]*receiver, projects)
	for i := range projects {
		ids[i] = newProject(t, st, rdb, fmt.Sprintf("share-%d", i))
		rcvs[i] = newReceiver(t, failFirst(1))
		createEndpoint(t, reg, ids[i], rcvs[i], AllEvents)
	}
	var counts [2]*countingTransport
	for i := range counts {
		counts[i] = &countingTransport{base: http.DefaultTransport}
		opts := fastOptions(fmt.Sprintf("d%d", i))
		opts.HTTPClient = &http.Client{Transport: counts[i], Timeout: 5 * time.Second}
		startDispatcher(t, rdb, opts)
	}
	var wg sync.WaitGroup
	for i := range projects {
		wg.Go(func() { runSessions(t, st, ids[i], 2) })
	}
	wg.Wait()
	want := 2 * len(publicLifecycle)
	for i, r := range rcvs {
		waitFor(t, fmt.Sprintf("project %d's events", i), func() bool { return len(r.succeeded()) >= want })
	}
	time.Sleep(50 * time.Millisecond) // the point: room for a stray or duplicate request to show
	for i, r := range rcvs {
		if n := len(r.succeeded()); n != want {
			t.Errorf("project %d: %d successes, want %d", i, n, want)
		}
		checkOrder(t, r.all(), outbox(t, rdb, ids[i]))
	}
	n0, n1 := counts[0].n.Load(), counts[1].n.Load()
	t.Logf("requests by dispatcher: %d and %d", n0, n1)
	if n0 == 0 || n1 == 0 {
		t.Errorf("one dispatcher did all the work: %d and %d requests", n0, n1)
	}
}

// redisCalls answers the commands Redis has run since its statistics were last reset,
// leaving out the INFO and CONFIG commands that read and reset them.
func redisCalls(t *testing.T, rdb redis.UniversalClient) (int, map[string]int) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	total, by := 0, map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		if name == "info" || strings.HasPrefix(name, "config") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, _ := strconv.Atoi(calls)
		total += n
		by[name] = n
	}
	return total, by
}

// TestIdleIsQuiet: a dispatcher with 1,000 projects and nothing to do, a retry an hour
// away, issues almost no Redis commands: it blocks on the signals, and wakes at most every
// maxWait (30 s).
func TestIdleIsQuiet(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	for i := range 1000 {
		if _, _, err := st.CreateProject(ctx, fmt.Sprintf("idle-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Some history: a project whose events went out, and one whose endpoint is down, its
	// retry an hour away.
	ok, down := newBareProject(t, st, "ok"), newBareProject(t, st, "down")
	rOK := newReceiver(t, nil)
	rDown := newReceiver(t, func(int, string) int { return http.StatusServiceUnavailable })
	createEndpoint(t, reg, ok, rOK, AllEvents)
	createEndpoint(t, reg, down, rDown, AllEvents)
	opts := fastOptions("idle")
	opts.Backoff = func(int) time.Duration { return time.Hour }
	d := NewDispatcher(rdb, reg, opts)
	swept := sweepDone(d)
	runDispatcher(t, d)
	await(t, "the start sweep", swept)
	runSessions(t, st, ok, 1)
	if _, err := runSession(st, down, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deliveries", func() bool { return len(rOK.succeeded()) == 4 && len(rDown.all()) == 1 })
	waitFor(t, "the retry scheduled", func() bool {
		z, err := rdb.ZRangeWithScores(ctx, store.WebhooksDueKey, 0, -1).Result()
		return err == nil && len(z) == 1 && z[0].Member == down && z[0].Score > float64(time.Now().Add(30*time.Minute).UnixMilli())
	})
	waitFor(t, "the outboxes trimmed", func() bool {
		n1, err1 := rdb.XLen(ctx, store.Outbox(ok)).Result()
		n2, err2 := rdb.XLen(ctx, store.Outbox(down)).Result()
		return err1 == nil && err2 == nil && n1 == 0 && n2 == 0
	})

	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const window = 3 * time.Second
	time.Sleep(window) // the point: the dispatcher idles for a while
	n, by := redisCalls(t, rdb)
	t.Logf("%d commands in %v: %v", n, window, by)
	if n > 10 {
		t.Errorf("an idle dispatcher issued %d Redis commands in %v: %v", n, window, by)
	}
}

// TestSweepFindsLostWork: work whose signal was lost (the writer died between its write and
// its signal), and a retry whose entry in the global due set was lost, are found by the
// sweep at start; events written with no signal while the dispatcher runs, by the next one.
func TestSweepFindsLostWork(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	a, b := newProject(t, st, rdb, "lost-signal"), newProject(t, st, rdb, "lost-due")
	ra := newReceiver(t, nil)
	rb := newReceiver(t, func(int, string) int { return http.StatusServiceUnavailable })
	createEndpoint(t, reg, a, ra, AllEvents)
	createEndpoint(t, reg, b, rb, AllEvents)

	// b: a delivery failing, then the dispatcher gone and b's due entry lost.
	stop := startDispatcher(t, rdb, fastOptions("first"))
	if _, err := runSession(st, b, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's retries", func() bool { return len(rb.all()) >= 2 })
	stop()
	if err := rdb.ZRem(ctx, store.WebhooksDueKey, b).Err(); err != nil {
		t.Fatal(err)
	}
	// a: events whose signals nobody will see.
	runSessions(t, st, a, 1)
	lost, err := st.Signals(ctx, store.WorkOutbox, Group, "thief", 0, 1000)
	if err != nil || len(lost) == 0 {
		t.Fatalf("signals %v %v", lost, err)
	}
	if err := st.AckSignals(ctx, store.WorkOutbox, Group, lost); err != nil {
		t.Fatal(err)
	}

	rb.setPolicy(nil)
	stop = startDispatcher(t, rdb, fastOptions("second")) // the next sweep is 5 min away
	waitFor(t, "a's events", func() bool { return len(ra.succeeded()) == len(publicLifecycle) })
	waitFor(t, "b's retry", func() bool { return len(rb.succeeded()) == 1 })
	stop()

	// An event appended with no signal after the start sweep.
	opts := fastOptions("third")
	opts.SweepInterval = 200 * time.Millisecond
	d := NewDispatcher(rdb, reg, opts)
	swept := sweepDone(d)
	runDispatcher(t, d)
	await(t, "the start sweep", swept)
	sid := "sess_unsignalled"
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: store.Outbox(a), Values: []any{
		"id", session.NewID("evt_", time.Now()), "type", session.EventSnapshotReady, "session_id", sid,
		"project_id", a, "at", time.Now().UnixMilli(), "object", `{"id":"snap_1"}`,
	}}).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unsignalled event", func() bool { return len(ra.succeeded()) == len(publicLifecycle)+1 })
}

// TestOutboxTrimmed: the dispatcher trims what every consumer group has acknowledged: a
// project's outbox with no endpoint, and one whose events were delivered, shrink to
// nothing; one with another group behind keeps from that group's oldest pending entry.
func TestOutboxTrimmed(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.Name, func(t *testing.T) { testOutboxTrimmed(t, b.New(t)) })
	}
}

func testOutboxTrimmed(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	none, delivered, behind := newBareProject(t, st, "none"), newBareProject(t, st, "delivered"), newBareProject(t, st, "behind")
	rcv := newReceiver(t, nil)
	createEndpoint(t, reg, delivered, rcv, AllEvents)
	// behind: another group that read two entries and acknowledged the first.
	runSessions(t, st, behind, 1)
	other := store.Outbox(behind)
	if err := rdb.XGroupCreate(ctx, other, "other", "0").Err(); err != nil {
		t.Fatal(err)
	}
	read, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "other", Consumer: "c", Streams: []string{other, ">"},
		Count: 2, Block: -1}).Result()
	if err != nil || len(read) != 1 || len(read[0].Messages) != 2 {
		t.Fatalf("the other group read %v %v", read, err)
	}
	if err := rdb.XAck(ctx, other, "other", read[0].Messages[0].ID).Err(); err != nil {
		t.Fatal(err)
	}
	total, err := rdb.XLen(ctx, other).Result()
	if err != nil {
		t.Fatal(err)
	}

	startDispatcher(t, rdb, fastOptions("t1"))
	runSessions(t, st, none, 2)
	runSessions(t, st, delivered, 2)
	waitFor(t, "the deliveries", func() bool { return len(rcv.succeeded()) == 2*len(publicLifecycle) })
	xlen := func(p string) int64 {
		n, err := rdb.XLen(ctx, store.Outbox(p)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "the outboxes trimmed", func() bool { return xlen(none) == 0 && xlen(delivered) == 0 })
	waitFor(t, "the outbox with a group behind trimmed to it", func() bool { return xlen(behind) == total-1 })
	first, err := rdb.XRangeN(ctx, other, "-", "+", 1).Result()
	if err != nil || len(first) != 1 || first[0].ID != read[0].Messages[1].ID {
		t.Errorf("the outbox starts at %v, want the other group's pending %s", first, read[0].Messages[1].ID)
	}
}

// TestHeldOutboxReadAgain: a dispatcher that finds a project's outbox held by another asks
// the holder for one more read (its letGo answers "read again" once) and makes the project
// due when the hold would lapse, in case the holder died.
func TestHeldOutboxReadAgain(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "held")
	rcv := newReceiver(t, nil)
	createEndpoint(t, reg, project, rcv, AllEvents)
	k := projectKeys(project)
	const other = "other/1"
	if err := rdb.Set(ctx, k.owner(), other, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	stop := startDispatcher(t, rdb, fastOptions("t1"))
	if _, err := runSession(st, project, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request to read again", func() bool {
		n, err := rdb.Exists(ctx, k.again()).Result()
		return err == nil && n == 1
	})
	waitFor(t, "the project due when the hold lapses", func() bool {
		s, err := rdb.ZScore(ctx, store.WebhooksDueKey, project).Result()
		return err == nil && s > float64(time.Now().Add(30*time.Second).UnixMilli())
	})
	// Stopped first: a dispatcher woken again while the outbox is held asks again, which is
	// right, but would make the holder's second letGo below read again too (CI saw it).
	stop()
	letGo := func() int {
		n, err := letGoScript.Run(ctx, rdb, []string{k.owner(), k.again(), store.Outbox(project)},
			other, time.Minute.Milliseconds(), Group, "0").Int()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := letGo(); n != 1 {
		t.Fatalf("the holder's first letGo answered %d, want 1 (read again)", n)
	}
	if n := letGo(); n != 0 {
		t.Fatalf("the holder's second letGo answered %d, want 0 (let go)", n)
	}
	if len(rcv.all()) != 0 {
		t.Fatal("delivered while another dispatcher held the outbox")
	}
}
