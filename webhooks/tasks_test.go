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

// TestTaskEncodedOnce: a queued delivery holds its payload as the JSON it is, not as a JSON
// string of it (which escaped the payload's quotes and backslashes a second time: a run's
// output of quotes made its task twice the payload), and a task queued that way by a
// dispatcher of before (Redis holds them through an upgrade) is still delivered, its payload
// as it was signed and sent then.
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
	if body := fields["body"]; len(body) == 0 || body[0] != '{' {
		t.Fatalf("the queued task's body is %.80s…, want the payload's JSON object", body)
	}
	if len(raw) > len(fields["body"])+500 {
		t.Errorf("the queued task has %d bytes for a payload of %d", len(raw), len(fields["body"]))
	}

	// The same task as a dispatcher of before queued it: its body a JSON string of the payload.
	var cur task
	if err := json.Unmarshal([]byte(raw), &cur); err != nil {
		t.Fatal(err)
	}
	before, err := json.Marshal(map[string]string{"event_id": cur.EventID, "type": cur.Type, "session_id": cur.SessionID, "body": string(cur.Body)})
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.LSet(ctx, queue, 0, before).Err(); err != nil {
		t.Fatal(err)
	}
	// As its dispatcher counted it.
	if err := rdb.HIncrBy(ctx, k.queued(), ep.ID, int64(len(before)-len(raw))).Err(); err != nil {
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
		t.Errorf("delivered %v, want %s (queued as before) run_old and %s run_new", got, old, fresh)
	}
	waitFor(t, "the endpoint's queued count back to 0", func() bool { return queuedCount(t, rdb, project, ep.ID) == 0 })
}
