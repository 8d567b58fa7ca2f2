package webhooks

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// TestTaskEncodedOnce: a queued delivery is read whether it holds its payload as the JSON it
// is or as a JSON string of it (which escapes the payload's quotes and backslashes a second
// time: a run's output of quotes made its task twice the payload), each delivered with its
// payload as it was signed. Tasks are still queued as strings, the form dispatchers of before
// read (Redis holds the queues through a rolling deploy).
func TestTaskEncodedOnce(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "tasks")
	var accept atomic.Bool
	rcv := newReceiver(t, func(int, string) int {
		if accept.Load() {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	})
	ep := createEndpoint(t, reg, project, rcv, AllEvents)
	opts := fastOptions("t1")
	opts.Backoff = func(int) time.Duration { return 100 * time.Millisecond }
	startDispatcher(t, rdb, opts)

	out := strings.Repeat(`"quoted" \back\ `, 200)
	sid := "sess_tasks"
	event := func(id string) string {
		t.Helper()
		evID, err := st.AppendEvent(ctx, project, session.EventRunFinished, sid, &session.Run{ID: id, Object: "run", Stdout: out})
		if err != nil {
			t.Fatal(err)
		}
		return evID
	}
	k := projectKeys(project)
	queue := k.queue(queueName(ep.ID, sid))
	old := event("run_old")
	waitFor(t, "a failed attempt", func() bool { return len(rcv.all()) > 0 })
	raw, err := rdb.LIndex(ctx, queue, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &fields); err != nil {
		t.Fatalf("the queued task %.200s: %v", raw, err)
	}
	if body := fields["body"]; len(body) == 0 || body[0] != '"' {
		t.Fatalf("the queued task's body is %.80s…, want a JSON string of the payload, which dispatchers of before read", body)
	}

	// The same task with its body as the payload's JSON value, as a later dispatcher queues it.
	cur, err := decodeTask([]byte(raw))
	if err != nil || len(cur.Body) == 0 || cur.Body[0] != '{' {
		t.Fatalf("the queued task decoded: %.80s, %v; want the payload's JSON object", cur.Body, err)
	}
	later, err := json.Marshal(cur)
	if err != nil {
		t.Fatal(err)
	}
	if len(later) > len(cur.Body)+500 {
		t.Errorf("the task as a value has %d bytes for a payload of %d", len(later), len(cur.Body))
	}
	if err := rdb.LSet(ctx, queue, 0, later).Err(); err != nil {
		t.Fatal(err)
	}
	// As its dispatcher counted it.
	if err := rdb.HIncrBy(ctx, k.queued(), ep.ID, int64(len(later)-len(raw))).Err(); err != nil {
		t.Fatal(err)
	}
	accept.Store(true)
	fresh := event("run_new")
	waitFor(t, "both deliveries", func() bool { return len(rcv.succeeded()) >= 2 })
	got := map[string]string{}
	for _, q := range rcv.succeeded() {
		var run session.Run
		if q.VerifyErr != nil || json.Unmarshal(q.Payload.Data.Object, &run) != nil {
			t.Errorf("delivery %s: %v, object %s", q.ID, q.VerifyErr, q.Payload.Data.Object)
			continue
		}
		if run.Stdout != out || q.Payload.Type != session.EventRunFinished {
			t.Errorf("delivery %s of %s: %s, stdout %.40q…; want run.finished with the run's output", q.ID, run.ID, q.Payload.Type, run.Stdout)
		}
		got[q.ID] = run.ID
	}
	if got[old] != "run_old" || got[fresh] != "run_new" {
		t.Errorf("delivered %v, want %s (queued as a value) run_old and %s (as a string) run_new", got, old, fresh)
	}
	waitFor(t, "the endpoint's queued count back to 0", func() bool { return queuedCount(t, rdb, project, ep.ID) == 0 })
}
