package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// appendRun appends a run.finished event of about size bytes for session sid.
func appendRun(t *testing.T, st *store.Store, project, sid string, i, size int) string {
	t.Helper()
	id, err := st.AppendEvent(context.Background(), project, session.EventRunFinished, sid,
		&session.Run{ID: fmt.Sprintf("run_%d", i), Object: "run", Stdout: strings.Repeat("x", size)})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// backlog answers the bytes held in the endpoint's queues of sessions sids, and how many
// tasks they hold.
func backlog(t *testing.T, rdb redis.UniversalClient, project, endpoint string, sids []string) (bytes int64, tasks int) {
	t.Helper()
	for _, sid := range sids {
		q, err := rdb.LRange(context.Background(), projectKeys(project).queue(queueName(endpoint, sid)), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range q {
			bytes += int64(len(task))
		}
		tasks += len(q)
	}
	return bytes, tasks
}

// queuedCount is the endpoint's count in the queued hash, 0 when it has none.
func queuedCount(t *testing.T, rdb redis.UniversalClient, project, endpoint string) int64 {
	t.Helper()
	n, err := rdb.HGet(context.Background(), projectKeys(project).queued(), endpoint).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBacklogBounded: an endpoint that fails keeps at most MaxQueuedBytes queued, over all
// its sessions, however many events come; each event it does not get is in its delivery log,
// and a healthy endpoint of the same project gets every event.
func TestBacklogBounded(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newBareProject(t, st, "backlog")
	down := newReceiver(t, func(int, string) int { return http.StatusInternalServerError })
	up := newReceiver(t, nil)
	bad := createEndpoint(t, reg, project, down, AllEvents)
	good := createEndpoint(t, reg, project, up, AllEvents)
	opts := fastOptions("t1")
	opts.MaxQueuedBytes = 4 << 10
	startDispatcher(t, rdb, opts)

	sids := []string{"sess_a", "sess_b", "sess_c"}
	const events = 30
	for i := range events {
		appendRun(t, st, project, sids[i%len(sids)], i, 500)
		// The healthy endpoint keeps up (a backlog of its own would be bounded as well).
		waitFor(t, "the event at the healthy endpoint", func() bool { return len(up.succeeded()) >= i+1 })
		if b, _ := backlog(t, rdb, project, bad.ID, sids); b > opts.MaxQueuedBytes {
			t.Fatalf("after %d events the failing endpoint has %d bytes queued; the bound is %d", i+1, b, opts.MaxQueuedBytes)
		}
	}
	seen := map[string]bool{}
	for _, r := range up.succeeded() {
		seen[r.ID] = true
	}
	if len(seen) != events {
		t.Fatalf("the healthy endpoint got %d distinct events of %d", len(seen), events)
	}
	for _, d := range deliveries(t, reg, project, good.ID, 100) {
		if d.Status != StatusSucceeded {
			t.Errorf("healthy endpoint: %+v", d)
		}
	}
	b, queued := backlog(t, rdb, project, bad.ID, sids)
	if b > opts.MaxQueuedBytes || queued == 0 || queuedCount(t, rdb, project, bad.ID) != b {
		t.Fatalf("failing endpoint: %d bytes in %d tasks queued, counted %d; want at most %d, counted exactly",
			b, queued, queuedCount(t, rdb, project, bad.ID), opts.MaxQueuedBytes)
	}
	dropped := 0
	for _, d := range deliveries(t, reg, project, bad.ID, 100) {
		if d.Error != nil && strings.HasPrefix(*d.Error, "not queued") {
			dropped++
			if d.Status != StatusGaveUp || !strings.Contains(*d.Error, "4 KiB") || d.Attempt != 1 ||
				d.EventType != session.EventRunFinished || d.SessionID == nil || d.EventID == "" {
				t.Errorf("not-queued delivery %+v (error %q)", d, *d.Error)
			}
		}
	}
	if dropped+queued != events {
		t.Fatalf("failing endpoint: %d events queued, %d logged as not queued; want the %d events, each one way", queued, dropped, events)
	}
}

// TestBacklogCountReturnsToZero: an endpoint's count of queued bytes goes back to 0 once its
// backlog is delivered, never below (tasks queued before the count was kept), and leaves with
// the endpoint, whether its registry or the dispatcher finds it gone.
func TestBacklogCountReturnsToZero(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newBareProject(t, st, "count")
	k := projectKeys(project)
	fail := func(int, string) int { return http.StatusServiceUnavailable }
	rcv, gone, lost := newReceiver(t, fail), newReceiver(t, fail), newReceiver(t, fail)
	ep := createEndpoint(t, reg, project, rcv, AllEvents)
	deleted := createEndpoint(t, reg, project, gone, AllEvents)
	vanished := createEndpoint(t, reg, project, lost, AllEvents)
	startDispatcher(t, rdb, fastOptions("t1"))

	sids := []string{"sess_a", "sess_b"}
	for i := range 6 {
		appendRun(t, st, project, sids[i%2], i, 100)
	}
	all := []string{ep.ID, deleted.ID, vanished.ID}
	waitFor(t, "six tasks queued for each endpoint", func() bool {
		for _, e := range all {
			if _, n := backlog(t, rdb, project, e, sids); n != 6 {
				return false
			}
		}
		return true
	})
	for _, e := range all {
		if b, _ := backlog(t, rdb, project, e, sids); queuedCount(t, rdb, project, e) != b {
			t.Fatalf("%s: counted %d bytes queued, holds %d", e, queuedCount(t, rdb, project, e), b)
		}
	}

	// As if what is queued now had been queued before the count was kept: one task counted.
	if err := rdb.HDel(ctx, k.queued(), ep.ID).Err(); err != nil {
		t.Fatal(err)
	}
	appendRun(t, st, project, sids[0], 6, 100)
	waitFor(t, "the seventh task", func() bool { _, n := backlog(t, rdb, project, ep.ID, sids); return n == 7 })
	if queuedCount(t, rdb, project, ep.ID) <= 0 {
		t.Fatal("the new task was not counted")
	}
	rcv.setPolicy(nil)
	waitFor(t, "the backlog delivered", func() bool { return len(rcv.succeeded()) == 7 })
	waitFor(t, "the count gone", func() bool {
		n, err := rdb.HExists(ctx, k.queued(), ep.ID).Result()
		return err == nil && !n
	})

	// Deleted through the registry, and gone from the endpoints hash without a word (a
	// registry that kept no count deleted it): the dispatcher drops its queues and its count.
	if err := reg.Delete(ctx, project, deleted.ID); err != nil {
		t.Fatal(err)
	}
	if n := queuedCount(t, rdb, project, deleted.ID); n != 0 {
		t.Fatalf("a deleted endpoint still counts %d bytes queued", n)
	}
	if err := rdb.HDel(ctx, k.endpoints(), vanished.ID).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the queues and counts of the endpoints gone", func() bool {
		_, a := backlog(t, rdb, project, deleted.ID, sids)
		_, b := backlog(t, rdb, project, vanished.ID, sids)
		n, err := rdb.HLen(ctx, k.queued()).Result()
		return a+b == 0 && err == nil && n == 0
	})
}

// TestBacklogBoundSparesASlowEndpoint: the bound is for an endpoint that fails; one that
// accepts every delivery, however slowly, gets every event even while more than the bound
// waits for it (a review found a first version dropping events for a healthy endpoint that a
// burst of runs' events had got behind).
func TestBacklogBoundSparesASlowEndpoint(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newBareProject(t, st, "slow")
	slow := newReceiver(t, func(int, string) int {
		time.Sleep(100 * time.Millisecond)
		return http.StatusOK
	})
	ep := createEndpoint(t, reg, project, slow, AllEvents)
	opts := fastOptions("t1")
	opts.MaxQueuedBytes = 4 << 10
	startDispatcher(t, rdb, opts)

	const events = 20 // of 500 bytes of output each, all at once: about twice the bound
	for i := range events {
		appendRun(t, st, project, "sess_a", i, 500)
	}
	waitFor(t, "every event at the slow endpoint", func() bool { return len(slow.succeeded()) >= events })
	for _, d := range deliveries(t, reg, project, ep.ID, 100) {
		if d.Status != StatusSucceeded {
			t.Errorf("slow but healthy endpoint: %+v", d)
		}
	}
}
