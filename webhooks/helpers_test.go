package webhooks

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"wb/session"
	"wb/store"
)

// received is one request a receiver got.
type received struct {
	ID, Timestamp string
	Payload       Payload
	Object        session.Session
	Status        int   // what the receiver answered
	VerifyErr     error // from the independent Standard Webhooks verifier
}

// receiver is an httptest endpoint that verifies every request's signature with the
// reference Standard Webhooks library and answers what policy says.
type receiver struct {
	srv *httptest.Server

	mu     sync.Mutex
	secret string
	policy func(n int, typ string) int // n counts requests from 0
	reqs   []received
}

func newReceiver(t *testing.T, policy func(n int, typ string) int) *receiver {
	t.Helper()
	r := &receiver{policy: policy}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := received{ID: req.Header.Get(HeaderID), Timestamp: req.Header.Get(HeaderTimestamp)}
	if req.Header.Get("Content-Type") != "application/json" {
		rec.VerifyErr = errString("content type " + req.Header.Get("Content-Type"))
	} else if wh, err := standardwebhooks.NewWebhook(r.secret); err != nil {
		rec.VerifyErr = err
	} else {
		rec.VerifyErr = wh.Verify(body, req.Header)
	}
	if err := json.Unmarshal(body, &rec.Payload); err != nil && rec.VerifyErr == nil {
		rec.VerifyErr = err
	}
	_ = json.Unmarshal(rec.Payload.Data.Object, &rec.Object)
	rec.Status = http.StatusOK
	if r.policy != nil {
		rec.Status = r.policy(len(r.reqs), rec.Payload.Type)
	}
	r.reqs = append(r.reqs, rec)
	w.WriteHeader(rec.Status)
}

type errString string

func (e errString) Error() string { return string(e) }

func (r *receiver) setSecret(s string) {
	r.mu.Lock()
	r.secret = s
	r.mu.Unlock()
}

func (r *receiver) setPolicy(p func(n int, typ string) int) {
	r.mu.Lock()
	r.policy = p
	r.mu.Unlock()
}

func (r *receiver) all() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.reqs...)
}

// succeeded returns the requests answered 2xx.
func (r *receiver) succeeded() []received {
	var out []received
	for _, q := range r.all() {
		if q.Status/100 == 2 {
			out = append(out, q)
		}
	}
	return out
}

func failFirst(n int) func(int, string) int {
	return func(i int, _ string) int {
		if i < n {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
}

// fastOptions retry after 10 ms.
func fastOptions(consumer string) Options {
	return Options{
		Consumer: consumer,
		Backoff:  func(int) time.Duration { return 10 * time.Millisecond },
		Timeout:  5 * time.Second,
		Logger:   slog.New(slog.DiscardHandler),
	}
}

// startDispatcher runs a dispatcher until the returned stop is called (or the test ends);
// stop fails the test if Run does not return promptly.
func startDispatcher(t *testing.T, rdb redis.UniversalClient, opts Options) (stop func()) {
	t.Helper()
	return runDispatcher(t, NewDispatcher(rdb, NewRegistry(rdb, RegistryOptions{AllowPrivate: true}), opts))
}

// runDispatcher is startDispatcher for a dispatcher made by the test.
func runDispatcher(t *testing.T, d *Dispatcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return 10 s after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newProject creates a project whose outbox keeps every event for the test to compare the
// deliveries with (see keepOutbox).
func newProject(t *testing.T, st *store.Store, rdb redis.UniversalClient, name string) string {
	t.Helper()
	p := newBareProject(t, st, name)
	keepOutbox(t, rdb, p)
	return p
}

// newBareProject creates a project, its outbox trimmed as the dispatcher consumes it.
func newBareProject(t *testing.T, st *store.Store, name string) string {
	t.Helper()
	p, _, err := st.CreateProject(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return p.ID
}

// keepOutbox adds a consumer group that never reads to the project's outbox: the dispatcher
// trims only what every group has acknowledged, so the outbox keeps every event.
func keepOutbox(t *testing.T, rdb redis.UniversalClient, project string) {
	t.Helper()
	if err := rdb.XGroupCreateMkStream(context.Background(), store.Outbox(project), "inspector", "0").Err(); err != nil {
		t.Fatal(err)
	}
}

func createEndpoint(t *testing.T, reg *Registry, project string, rcv *receiver, events ...string) Endpoint {
	t.Helper()
	e, err := reg.Create(context.Background(), project, rcv.srv.URL+"/hook", events)
	if err != nil {
		t.Fatal(err)
	}
	rcv.setSecret(e.Secret)
	return e
}

func newPending(project string) *session.Session {
	now := time.Now()
	return &session.Session{
		ID: session.NewID("sess_", now), Object: session.ObjectName, Tier: 2, State: session.Pending,
		ProjectID: project, Template: "tpl_base@sha256:abc", Region: "local",
		Resources:    session.Resources{VCPU: 1, MemoryMiB: 2048, DiskGiB: 10, SizeClass: "s"},
		IdleTimeoutS: 300, MaxLifetimeS: 3600, CreatedAt: *session.At(now),
	}
}

// lifecycle is pending → provisioning → running → stopping → stopped; the public events
// are the four of publicLifecycle.
var lifecycle = []store.Change{
	{From: session.Pending, To: session.Provisioning, Driver: session.Placer, Zone: "z1", NodeID: "n1"},
	{From: session.Provisioning, To: session.Running, Driver: session.Node},
	{From: session.Running, To: session.Stopping, Driver: session.Caller, Reason: session.Deleted},
	{From: session.Stopping, To: session.Stopped, Driver: session.Node, Reason: session.Deleted},
}

var publicLifecycle = []string{session.EventPending, session.EventRunning, session.EventStopping, session.EventStopped}

// runSession creates a session and makes the first steps of lifecycle.
func runSession(st *store.Store, project string, steps int) (string, error) {
	ctx := context.Background()
	s, err := st.Create(ctx, newPending(project), 100)
	if err != nil {
		return "", err
	}
	for _, c := range lifecycle[:steps] {
		c.Project, c.ID = project, s.ID
		if _, err := st.Transition(ctx, c); err != nil {
			return "", err
		}
	}
	return s.ID, nil
}

// runSessions runs n full lifecycles concurrently.
func runSessions(t *testing.T, st *store.Store, project string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ids[i], errs[i] = runSession(st, project, len(lifecycle)) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// outbox maps the project's event ids to their outbox events.
func outbox(t *testing.T, rdb redis.UniversalClient, project string) map[string]store.Event {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), store.Outbox(project), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.Event{}
	for _, m := range msgs {
		ev, err := store.DecodeEvent(m.ID, m.Values)
		if err != nil {
			t.Fatal(err)
		}
		out[ev.ID] = ev
	}
	return out
}

// checkOrder asserts that, per session, the requests (retries included) never go back to an
// earlier version, and that the successful ones are strictly increasing, each event once.
func checkOrder(t *testing.T, reqs []received, events map[string]store.Event) {
	t.Helper()
	last := map[string]int64{}
	lastOK := map[string]int64{}
	seen := map[string]bool{}
	for _, q := range reqs {
		ev, ok := events[q.ID]
		if !ok {
			t.Errorf("delivery of unknown event %s", q.ID)
			continue
		}
		if ev.Version < last[ev.SessionID] {
			t.Errorf("session %s: version %d delivered after %d", ev.SessionID, ev.Version, last[ev.SessionID])
		}
		last[ev.SessionID] = ev.Version
		if q.Status/100 != 2 {
			continue
		}
		if seen[q.ID] {
			t.Errorf("webhook-id %s succeeded twice", q.ID)
		}
		seen[q.ID] = true
		if ev.Version <= lastOK[ev.SessionID] {
			t.Errorf("session %s: version %d succeeded after %d", ev.SessionID, ev.Version, lastOK[ev.SessionID])
		}
		lastOK[ev.SessionID] = ev.Version
	}
}

// deliveries reads the endpoint's whole log, newest first, page by page.
func deliveries(t *testing.T, reg *Registry, project, endpoint string, pageSize int) []Delivery {
	t.Helper()
	var all []Delivery
	cursor := ""
	for range 1000 {
		page, next, err := reg.Deliveries(context.Background(), project, endpoint, pageSize, cursor)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if next == "" {
			return all
		}
		cursor = next
	}
	t.Fatal("deliveries: no end")
	return nil
}
