package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/desktop"
	"wb/session"
	"wb/store"
)

// takeoverLease is the lease of the killed gateway's claims in these tests: short, so that a
// retry takes the key over soon, and still long beside a handler's first steps.
const takeoverLease = 2 * time.Second

// diedHolding plays a gateway killed mid-request after its handler did its work: it claims
// key as that gateway's store would (with a lease of takeoverLease), runs h under the claim's
// ref as the idempotent middleware does, and ends the claim neither way, so that the answer
// is lost and the key is left to a retry once the lease lapses. pathID is the route's {id}
// (empty when it has none). It answers what h wrote.
func (e *env) diedHolding(key, target, pathID string, body []byte, h handler) *httptest.ResponseRecorder {
	e.t.Helper()
	ctx := context.Background()
	proj, err := e.st.GetProject(ctx, e.projA)
	if err != nil {
		e.t.Fatal(err)
	}
	dead := store.New(e.rdb, store.WithIdemLease(takeoverLease)) // the killed gateway's store
	_, claim, err := dead.IdemBegin(ctx, e.projA, key, fingerprint(httptest.NewRequest("POST", target, nil), body))
	if err != nil || claim == nil {
		e.t.Fatalf("the dead gateway's claim on %s: %v", key, err)
	}
	r := httptest.NewRequest("POST", target, bytes.NewReader(body))
	if pathID != "" {
		r.SetPathValue("id", pathID)
	}
	r = r.WithContext(context.WithValue(ctx, idemRefKey{}, idemRef{ref: claim.Ref}))
	w := httptest.NewRecorder()
	if err := h(w, r, proj); err != nil {
		e.gw.writeError(w, r, err)
	}
	time.Sleep(takeoverLease + 500*time.Millisecond) // its lease lapses: a retry takes the key over
	return w
}

// retried sends the request again with key, as a client whose answer was lost does, and
// decodes the answer into out. It must not be a replay: the dead gateway recorded none.
func (e *env) retried(key, target string, body []byte, status int, out any) {
	e.t.Helper()
	r := e.mustDo("POST", target, e.key, body, status, out, "Idempotency-Key", key)
	if r.header.Get("Idempotent-Replayed") != "" {
		e.t.Fatalf("the retry of %s was a replay, but the dead gateway recorded no answer", key)
	}
}

// runFinishedEvents counts the project's run.finished events: one for each run that ran.
func (e *env) runFinishedEvents() int {
	e.t.Helper()
	evs, err := e.st.OutboxEvents(context.Background(), e.projA)
	if err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Type == session.EventRunFinished {
			n++
		}
	}
	return n
}

// runKeys counts the runs the project has (each is under a key of its own).
func (e *env) runKeys() int {
	e.t.Helper()
	keys, err := e.rdb.Keys(context.Background(), "*{"+e.projA+"}:run:*").Result()
	if err != nil {
		e.t.Fatal(err)
	}
	return len(keys)
}

// TestIdempotencyTakeoverRun: a run whose gateway died after running it (its answer lost) is
// answered to the retry that takes its Idempotency-Key over, as it is: the command does not
// run a second time, and an ephemeral run admits no second session. Before, only sessions
// were named after the key's ref: the retry ran the command again, in a second session.
func TestIdempotencyTakeoverRun(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	cases := []struct {
		name, target string
		body         string
		status       int
		sessions     int // the project's sessions after the retry
	}{
		{"in a session", "/v1/runs", `{"session_id":"` + s.ID + `","command":"echo once"}`, 201, 1},
		{"ephemeral", "/v1/runs", `{"tier":1,"runtime":"sh","code":"echo once"}`, 201, 2},
		{"async", "/v1/runs?wait=false", `{"session_id":"` + s.ID + `","command":"echo once"}`, 202, 2},
	}
	for i, c := range cases {
		key := "run-died-" + c.name
		runs, ran := e.runKeys(), e.runFinishedEvents()
		w := e.diedHolding(key, c.target, "", []byte(c.body), e.gw.createRun)
		var first, again session.Run
		if w.Code != c.status || json.Unmarshal(w.Body.Bytes(), &first) != nil {
			t.Fatalf("%s: the dead gateway's run answered %d %s", c.name, w.Code, w.Body)
		}
		e.retried(key, c.target, []byte(c.body), c.status, &again)
		if again.ID != first.ID {
			t.Errorf("%s: the retry answered run %s, a second run besides the dead gateway's %s", c.name, again.ID, first.ID)
		}
		if n := e.runKeys() - runs; n != 1 {
			t.Errorf("%s: %d runs made by the request and its retry, want 1", c.name, n)
		}
		if i < 2 { // the async run may still run: its end is not awaited
			if n := e.runFinishedEvents() - ran; n != 1 {
				t.Errorf("%s: the command ran %d times, want once", c.name, n)
			}
			if again.State != session.RunSucceeded || again.Stdout != "once\n" {
				t.Errorf("%s: the retry answered %s %q, want the dead gateway's run as it ended", c.name, again.State, again.Stdout)
			}
		}
		var list struct{ Data []session.Session }
		e.mustDo("GET", "/v1/sessions?limit=100", e.key, nil, 200, &list)
		if len(list.Data) != c.sessions {
			t.Errorf("%s: %d sessions after the retry, want %d (an ephemeral run's one)", c.name, len(list.Data), c.sessions)
		}
	}
}

// TestIdempotencyTakeoverEphemeralSession: an ephemeral run whose gateway died after
// admitting its session, before the run was saved (so nothing ran), is run by the retry that
// takes the Idempotency-Key over, in that session: no second session is admitted.
func TestIdempotencyTakeoverEphemeralSession(t *testing.T) {
	e := newEnv(t)
	body := []byte(`{"tier":1,"runtime":"sh","code":"echo once"}`)
	var admitted string
	e.diedHolding("run-died-admitted", "/v1/runs", "", body, func(w http.ResponseWriter, r *http.Request, p store.Project) error {
		tier := 1
		sess, _, err := e.gw.admitRequest(r.Context(), p, session.CreateRequest{Tier: &tier, Template: "tpl_base"},
			"sess_"+idemRefOf(r.Context()).ref, map[string]string{session.RunMetadataKey: "sh"})
		if err != nil {
			return err
		}
		admitted = sess.ID
		return nil
	})
	var run session.Run
	e.retried("run-died-admitted", "/v1/runs", body, 201, &run)
	if run.State != session.RunSucceeded || run.SessionID == nil || *run.SessionID != admitted {
		t.Errorf("the retry's run: %s in session %s, want succeeded in the dead gateway's %s", run.State, derefOr(run.SessionID), admitted)
	}
	var list struct{ Data []session.Session }
	e.mustDo("GET", "/v1/sessions?limit=100", e.key, nil, 200, &list)
	if len(list.Data) != 1 {
		t.Errorf("%d sessions after the retry, want 1 (the dead gateway's)", len(list.Data))
	}
}

// TestIdempotencyTakeoverDesktop: a desktop whose gateway died after creating it is answered
// to the retry that takes the Idempotency-Key over. Before, the retry created (and billed) a
// second desktop.
func TestIdempotencyTakeoverDesktop(t *testing.T) {
	e := newEnv(t)
	body := []byte(`{"name":"once"}`)
	w := e.diedHolding("desktop-died", "/v1/desktops", "", body, e.gw.createDesktop)
	var first, again desktop.Desktop
	if w.Code != 201 || json.Unmarshal(w.Body.Bytes(), &first) != nil {
		t.Fatalf("the dead gateway's create answered %d %s", w.Code, w.Body)
	}
	e.retried("desktop-died", "/v1/desktops", body, 201, &again)
	if again.ID != first.ID {
		t.Errorf("the retry answered desktop %s, a second one besides the dead gateway's %s", again.ID, first.ID)
	}
	var list struct{ Data []desktop.Desktop }
	e.mustDo("GET", "/v1/desktops", e.key, nil, 200, &list)
	if len(list.Data) != 1 {
		t.Errorf("%d desktops after the retry, want 1: %+v", len(list.Data), list.Data)
	}
	e.waitDesktop(first.ID, desktop.Running)
}

// TestIdempotencyTakeoverWebhookEndpoint: an endpoint whose gateway died after creating it is
// answered, with its secret, to the retry that takes the Idempotency-Key over. Before, the
// retry created a second endpoint, and every event was delivered twice.
func TestIdempotencyTakeoverWebhookEndpoint(t *testing.T) {
	e := newEnv(t)
	body := []byte(`{"url":"http://127.0.0.1:9/hook","events":["session.running"]}`)
	w := e.diedHolding("endpoint-died", "/v1/webhook_endpoints", "", body, e.gw.createEndpoint)
	var first, again WebhookEndpointCreated
	if w.Code != 201 || json.Unmarshal(w.Body.Bytes(), &first) != nil {
		t.Fatalf("the dead gateway's create answered %d %s", w.Code, w.Body)
	}
	e.retried("endpoint-died", "/v1/webhook_endpoints", body, 201, &again)
	if again.ID != first.ID || again.Secret != first.Secret || again.Secret == "" {
		t.Errorf("the retry answered endpoint %s (secret shown: %v), want the dead gateway's %s with its secret",
			again.ID, again.Secret != "", first.ID)
	}
	var list struct{ Data []WebhookEndpoint }
	e.mustDo("GET", "/v1/webhook_endpoints", e.key, nil, 200, &list)
	if len(list.Data) != 1 {
		t.Errorf("%d webhook endpoints after the retry, want 1: %+v", len(list.Data), list.Data)
	}
}

// TestIdempotencyTakeoverSnapshot: a snapshot whose gateway died after taking it is answered
// to the retry that takes the Idempotency-Key over. Before, the retry took a second snapshot
// (counted against the plan's snapshots).
func TestIdempotencyTakeoverSnapshot(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	target := "/v1/sessions/" + s.ID + ":snapshot"
	w := e.diedHolding("snapshot-died", target, s.ID+":snapshot", nil, e.gw.sessionAction)
	var first, again session.Snapshot
	if w.Code != 201 || json.Unmarshal(w.Body.Bytes(), &first) != nil {
		t.Fatalf("the dead gateway's snapshot answered %d %s", w.Code, w.Body)
	}
	e.retried("snapshot-died", target, nil, 201, &again)
	if again.ID != first.ID || again.State != session.SnapshotReady {
		t.Errorf("the retry answered snapshot %s (%s), want the dead gateway's %s", again.ID, again.State, first.ID)
	}
	var list struct{ Data []session.Snapshot }
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &list)
	if len(list.Data) != 1 {
		t.Errorf("%d snapshots after the retry, want 1: %+v", len(list.Data), list.Data)
	}
}

// TestIdempotencyTakeoverSnapshotUnderWay: a retry that takes an Idempotency-Key over while
// the session still takes the snapshot of the gateway that died (its work lease outlasts the
// key's) waits for the recovery to end that snapshot, and answers it, as recorded. Before, the
// retry answered 409 "session is snapshotting", which the key then kept for 24 h.
func TestIdempotencyTakeoverSnapshotUnderWay(t *testing.T) {
	const workLease = 2 * takeoverLease
	e := newEnv(t, func(c *Config) { c.WorkLease = workLease })
	s := e.running(map[string]any{"tier": 2})
	target := "/v1/sessions/" + s.ID + ":snapshot"
	var taking string
	e.diedHolding("snapshot-under-way", target, s.ID+":snapshot", nil, func(w http.ResponseWriter, r *http.Request, p store.Project) error {
		// Killed once the session snapshots, its lease taken and never renewed.
		ctx := r.Context()
		taking = "snap_" + idemRefOf(ctx).ref
		if _, err := e.st.Transition(ctx, store.Change{Project: p.ID, ID: s.ID, From: session.Running, To: session.Snapshotting,
			Driver: session.Caller, Snapshot: taking}); err != nil {
			return err
		}
		return e.st.SetSnapshotWork(ctx, store.SessionRef{Project: p.ID, ID: s.ID}, taking, time.Now().Add(workLease))
	})
	var got session.Snapshot
	e.retried("snapshot-under-way", target, nil, 201, &got)
	if got.ID != taking || got.State != session.SnapshotFailed {
		t.Errorf("the retry answered snapshot %s (%s), want the dead gateway's %s as its recovery recorded it (failed)", got.ID, got.State, taking)
	}
	if st := e.sessionOf(s.ID).State; st != session.Running {
		t.Errorf("the session is %s after the retry, want running", st)
	}
	var list struct{ Data []session.Snapshot }
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &list)
	if len(list.Data) != 1 {
		t.Errorf("%d snapshots after the retry, want 1: %+v", len(list.Data), list.Data)
	}
}

// gatewayWith starts another gateway on e's Redis and node whose store has a Redis client of
// its own, with hook (nil: none) and opts, and answers it and an env whose requests go to it
// (e's still go where they did).
func (e *env) gatewayWith(hook redis.Hook, cfg func(*Config), opts ...store.Option) (*Server, *env) {
	e.t.Helper()
	o := *e.rdb.(*redis.Client).Options()
	rdb := redis.NewClient(&o)
	e.t.Cleanup(func() { _ = rdb.Close() }) // after the gateway's, registered later
	if hook != nil {
		rdb.AddHook(hook)
	}
	c := e.gw.Config
	c.Store = store.New(rdb, append([]store.Option{store.WithTiers(patientTiers())}, opts...)...)
	c.Metrics = NewMetrics(c.Store)
	if cfg != nil {
		cfg(&c)
	}
	gw, url := e.startGateway(c)
	other := *e
	other.url, other.gw = url, gw
	return gw, &other
}

// in is e for subtest t: its failures and cleanups are t's.
func (e *env) in(t *testing.T) *env {
	c := *e
	c.t = t
	return &c
}

// stallAt is a hook that, from the first command match accepts, holds every command of its
// client (that one first) until release is called: a gateway that is slow (a long pause, a
// starved host, a partition from Redis) rather than dead. stalled is closed when it begins.
func stallAt(match func(redis.Cmder) bool) (hook processHook, stalled <-chan struct{}, release func()) {
	began, released := make(chan struct{}), make(chan struct{})
	var once, releaseOnce sync.Once
	hook = func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if match(cmd) {
			once.Do(func() { close(began) })
		}
		select {
		case <-began:
			<-released
		default:
		}
		return next(ctx, cmd)
	}
	return hook, began, func() { releaseOnce.Do(func() { close(released) }) }
}

// execsIn counts the commands the node ran in session id.
func (e *env) execsIn(id string) int {
	n := 0
	for _, c := range e.node.Calls() {
		if c == "exec:"+id {
			n++
		}
	}
	return n
}

// TestIdempotencyTakeoverRunFromSlowGateway: a gateway that stalls (slow, not dead) just
// before it saves its run loses its Idempotency-Key to a retry on another gateway once the
// key's lease lapses, and the retry runs the command. When the first gateway resumes, it
// finds the run made and answers it: the command runs once, and the run stays as the retry
// recorded it. Before, the first gateway overwrote the retry's run and ran the command again
// (in the session; an ephemeral run's, ended by then, failed and was recorded failed).
func TestIdempotencyTakeoverRunFromSlowGateway(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	for _, c := range []struct{ name, body string }{
		{"in a session", `{"session_id":"` + s.ID + `","command":"echo once"}`},
		{"ephemeral", `{"tier":1,"runtime":"sh","code":"echo once"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := e.in(t)
			key := "run-slow-" + c.name
			hook, stalled, release := stallAt(func(cmd redis.Cmder) bool { return argHas(cmd, "}:run:") })
			defer release()
			_, slow := e.gatewayWith(hook, nil, store.WithIdemLease(time.Second))
			first := make(chan response, 1)
			go func() { first <- slow.do("POST", "/v1/runs", e.key, []byte(c.body), "Idempotency-Key", key) }()
			select {
			case <-stalled:
			case <-time.After(time.Minute):
				t.Fatal("the first gateway never came to save its run")
			}
			// The retry, on the other gateway, as a client whose request timed out sends it:
			// refused while the first holds the key, then taking it over once its lease lapses.
			var r response
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
				if r = e.do("POST", "/v1/runs", e.key, []byte(c.body), "Idempotency-Key", key); r.status != 409 || time.Now().After(deadline) {
					break
				}
			}
			var retried session.Run
			if r.status != 201 || json.Unmarshal(r.body, &retried) != nil || retried.State != session.RunSucceeded {
				t.Fatalf("the retry: %d %s, want 201 and the run succeeded", r.status, r.body)
			}
			release()
			a := <-first
			var answered session.Run
			if a.status != 201 || json.Unmarshal(a.body, &answered) != nil || answered.ID != retried.ID || answered.State != session.RunSucceeded {
				t.Errorf("the slow gateway answered %d %s, want the retry's run %s, succeeded", a.status, a.body, retried.ID)
			}
			if n := e.execsIn(*retried.SessionID); n != 1 {
				t.Errorf("the command ran %d times in session %s, want once", n, *retried.SessionID)
			}
			var got session.Run
			e.mustDo("GET", "/v1/runs/"+retried.ID, e.key, nil, 200, &got)
			if got.State != session.RunSucceeded || got.Stdout != "once\n" {
				t.Errorf("the run after both: %s %q (error %s), want succeeded, once", got.State, got.Stdout, derefOr(got.Error))
			}
		})
	}
}
