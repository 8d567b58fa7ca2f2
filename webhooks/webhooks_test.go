package webhooks

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"wb/desktop"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// backends are the real redis-server and miniredis.
func backends() []redistest.Backend {
	var out []redistest.Backend
	for _, b := range redistest.Backends() {
		if b.Name != "cluster" || !testing.Short() {
			out = append(out, b)
		}
	}
	return out
}

func TestRegistry(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.Name, func(t *testing.T) { testRegistry(t, b.New(t)) })
	}
}

func testRegistry(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	reg := NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	all := []string{AllEvents}
	bad := []struct {
		url    string
		events []string
		field  string
		says   []string
	}{
		{"", all, "url", nil},
		{"ftp://example.com/x", all, "url", []string{"http"}},
		{"/relative/path", all, "url", []string{"absolute"}},
		{"example.com/hook", all, "url", nil},
		{"http://", all, "url", []string{"host"}},
		{"https:///path", all, "url", []string{"host"}},
		{"http://user:pw@example.com/", all, "url", nil},
		{"https://example.com/" + strings.Repeat("a", MaxURLLen), all, "url", []string{"2048"}},
		{"http://bad host/", all, "url", nil},
		{"https://example.com/hook", nil, "events", []string{session.EventRunning}},
		{"https://example.com/hook", []string{}, "events", nil},
		{"https://example.com/hook", []string{session.EventRunning, session.EventProvisioning}, "events",
			[]string{`"session.provisioning"`, session.EventRunning, session.EventQuotaExceeded, "*"}},
		{"https://example.com/hook", []string{"bogus"}, "events", []string{`"bogus"`}},
	}
	for _, c := range bad {
		_, err := reg.Create(ctx, "proj_a", c.url, c.events)
		var fe *session.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("Create(%.40q, %v): %v, want a FieldError on %s", c.url, c.events, err, c.field)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(fe.Message, s) {
				t.Errorf("Create(%.40q, %v): message %q does not say %s", c.url, c.events, fe.Message, s)
			}
		}
	}

	e, err := reg.Create(ctx, "proj_a", "https://example.com/hook?x=1",
		[]string{session.EventRunning, session.EventStopped, session.EventRunning})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(e.ID, EndpointPrefix) || len(e.ID) != len(EndpointPrefix)+18 || e.Object != EndpointObject {
		t.Errorf("endpoint %+v", e)
	}
	if !slices.Equal(e.Events, []string{session.EventRunning, session.EventStopped}) {
		t.Errorf("events %v", e.Events)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(e.Secret, SecretPrefix))
	if !strings.HasPrefix(e.Secret, SecretPrefix) || err != nil || len(key) != 24 {
		t.Errorf("secret %q: %d bytes, %v", e.Secret, len(key), err)
	}
	if _, err := standardwebhooks.NewWebhook(e.Secret); err != nil {
		t.Errorf("reference library rejects the secret: %v", err)
	}

	got, err := reg.Get(ctx, "proj_a", e.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := e
	want.Secret = ""
	if got.ID != want.ID || got.URL != want.URL || !slices.Equal(got.Events, want.Events) || !got.CreatedAt.Equal(want.CreatedAt.Time) || got.Secret != "" {
		t.Errorf("Get %+v, want %+v", got, want)
	}
	b, _ := json.Marshal(got)
	if strings.Contains(string(b), "secret") || strings.Contains(string(b), e.Secret) {
		t.Errorf("Get JSON shows the secret: %s", b)
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	if m["object"] != EndpointObject || !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(m["created_at"].(string)) {
		t.Errorf("Get JSON %s", b)
	}

	time.Sleep(2 * time.Millisecond) // a later created_at
	e2, err := reg.Create(ctx, "proj_a", "http://127.0.0.1:9/x", []string{AllEvents})
	if err != nil {
		t.Fatal(err)
	}
	list, err := reg.List(ctx, "proj_a")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != e2.ID || list[1].ID != e.ID {
		t.Fatalf("List %+v, want [%s %s]", list, e2.ID, e.ID)
	}
	for _, x := range list {
		if x.Secret != "" {
			t.Errorf("List shows the secret of %s", x.ID)
		}
	}
	if l, err := reg.List(ctx, "proj_b"); err != nil || len(l) != 0 {
		t.Errorf("proj_b List %v %v", l, err)
	}

	// Another project's id is not found, for every call.
	if _, err := reg.Get(ctx, "proj_b", e.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("other project's Get: %v", err)
	}
	if _, _, err := reg.Deliveries(ctx, "proj_b", e.ID, 10, ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("other project's Deliveries: %v", err)
	}
	if err := reg.Delete(ctx, "proj_b", e.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("other project's Delete: %v", err)
	}
	if _, err := reg.Get(ctx, "proj_a", "whe_nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}

	for _, c := range []struct {
		limit  int
		cursor string
		field  string
	}{{-1, "", "limit"}, {MaxDeliveriesLimit + 1, "", "limit"}, {10, "nope", "cursor"}, {10, "1-2-3", "cursor"}} {
		_, _, err := reg.Deliveries(ctx, "proj_a", e.ID, c.limit, c.cursor)
		var fe *session.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("Deliveries(%d, %q): %v, want a FieldError on %s", c.limit, c.cursor, err, c.field)
		}
	}
	if d, next, err := reg.Deliveries(ctx, "proj_a", e.ID, 0, ""); err != nil || len(d) != 0 || next != "" {
		t.Errorf("empty log: %v %q %v", d, next, err)
	}

	if err := reg.Delete(ctx, "proj_a", e.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Get(ctx, "proj_a", e.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Delete: %v", err)
	}
	if err := reg.Delete(ctx, "proj_a", e.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Delete: %v", err)
	}
}

// TestDelivery: three sessions driven concurrently through their lifecycle reach a receiver
// that fails its first three requests: every public event arrives once, signed, in order
// per session, and the log shows the failures and then the successes.
func TestDelivery(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.Name, func(t *testing.T) { testDelivery(t, b.New(t)) })
	}
}

func testDelivery(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "delivery")
	rcv := newReceiver(t, failFirst(3))
	ep := createEndpoint(t, reg, project, rcv, AllEvents)
	startDispatcher(t, rdb, fastOptions("t1"))

	ids := runSessions(t, st, project, 3)
	want := len(ids) * len(publicLifecycle)
	waitFor(t, "all events", func() bool { return len(rcv.succeeded()) >= want })
	waitFor(t, "the delivery log", func() bool {
		d, _, err := reg.Deliveries(ctx, project, ep.ID, 100, "")
		return err == nil && len(d) >= want+3
	})
	time.Sleep(50 * time.Millisecond) // room for a duplicate to show

	events := outbox(t, rdb, project)
	reqs := rcv.all()
	if len(reqs) != want+3 {
		t.Errorf("%d requests, want %d", len(reqs), want+3)
	}
	checkOrder(t, reqs, events)
	stamp := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)
	types := map[string][]string{}
	for _, q := range reqs {
		if q.VerifyErr != nil {
			t.Errorf("%s: signature: %v", q.ID, q.VerifyErr)
		}
		ev := events[q.ID]
		p := q.Payload
		if p.ID != q.ID || p.Type != ev.Type || q.Object.ID != ev.SessionID || q.Object.ProjectID != project {
			t.Errorf("payload %+v for event %+v", p, ev)
		}
		if b, _ := json.Marshal(p.CreatedAt); !stamp.Match(b[1:len(b)-1]) || p.CreatedAt.UnixMilli() != ev.AtMs {
			t.Errorf("created_at %s, event at %d", b, ev.AtMs)
		}
		wantReason := ""
		if p.Type == session.EventStopping || p.Type == session.EventStopped {
			wantReason = string(session.Deleted)
		}
		if p.Data.Reason != wantReason {
			t.Errorf("%s: reason %q, want %q", p.Type, p.Data.Reason, wantReason)
		}
		if q.Status == http.StatusOK {
			types[q.Object.ID] = append(types[q.Object.ID], p.Type)
		}
	}
	for _, id := range ids {
		if !slices.Equal(types[id], publicLifecycle) {
			t.Errorf("session %s got %v, want %v", id, types[id], publicLifecycle)
		}
	}

	// The log, newest first, paged: three retrying attempts answered 503, then success.
	log := deliveries(t, reg, project, ep.ID, 4)
	if len(log) != want+3 {
		t.Fatalf("log has %d attempts, want %d", len(log), want+3)
	}
	if all := deliveries(t, reg, project, ep.ID, 100); !slices.EqualFunc(all, log, func(a, b Delivery) bool { return a.ID == b.ID }) {
		t.Error("paging changes the log")
	}
	lastAttempt := map[string]Delivery{}
	var failed int
	for i := len(log) - 1; i >= 0; i-- {
		d := log[i]
		if d.Object != DeliveryObject || !strings.HasPrefix(d.ID, DeliveryPrefix) || d.EndpointID != ep.ID ||
			d.SessionID == nil || *d.SessionID != events[d.EventID].SessionID || d.EventType != events[d.EventID].Type {
			t.Errorf("delivery %+v", d)
		}
		prev, seen := lastAttempt[d.EventID]
		switch d.Status {
		case StatusRetrying:
			failed++
			if d.ResponseStatus != http.StatusServiceUnavailable || d.Error == nil || d.NextAttemptAt == nil {
				t.Errorf("failed attempt %+v", d)
			}
		case StatusSucceeded:
			if d.ResponseStatus != http.StatusOK || d.Error != nil || d.NextAttemptAt != nil {
				t.Errorf("succeeded attempt %+v", d)
			}
		default:
			t.Errorf("status %s", d.Status)
		}
		if seen && (prev.Status != StatusRetrying || d.Attempt != prev.Attempt+1) || !seen && d.Attempt != 1 {
			t.Errorf("attempt %d (%s) after %+v", d.Attempt, d.Status, prev)
		}
		lastAttempt[d.EventID] = d
	}
	if failed != 3 {
		t.Errorf("%d failed attempts logged, want 3", failed)
	}
	for id, d := range lastAttempt {
		if d.Status != StatusSucceeded {
			t.Errorf("event %s ends %s", id, d.Status)
		}
	}
}

// TestProjectsIsolated: project B's endpoint gets none of project A's events.
func TestProjectsIsolated(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	a, b := newProject(t, st, rdb, "a"), newProject(t, st, rdb, "b")
	ra, rb := newReceiver(t, nil), newReceiver(t, nil)
	createEndpoint(t, reg, a, ra, AllEvents)
	createEndpoint(t, reg, b, rb, AllEvents)
	startDispatcher(t, rdb, fastOptions("t1"))

	runSessions(t, st, a, 2)
	if _, err := runSession(st, b, 2); err != nil { // pending, running
		t.Fatal(err)
	}
	waitFor(t, "A's events", func() bool { return len(ra.succeeded()) >= 8 })
	waitFor(t, "B's events", func() bool { return len(rb.succeeded()) >= 2 })
	time.Sleep(50 * time.Millisecond) // the point: room for a stray or duplicate request to show

	for name, c := range map[string]struct {
		r       *receiver
		project string
		n       int
	}{"A": {ra, a, 8}, "B": {rb, b, 2}} {
		events := outbox(t, rdb, c.project)
		reqs := c.r.all()
		if len(reqs) != c.n {
			t.Errorf("%s got %d requests, want %d", name, len(reqs), c.n)
		}
		for _, q := range reqs {
			if _, ok := events[q.ID]; !ok || q.Object.ProjectID != c.project {
				t.Errorf("%s got event %s of project %s", name, q.ID, q.Object.ProjectID)
			}
			if q.VerifyErr != nil {
				t.Errorf("%s: %v", name, q.VerifyErr)
			}
		}
		checkOrder(t, reqs, events)
	}
}

// TestEventFilter: an endpoint subscribed to session.running gets only those, while a "*"
// endpoint of the same project gets everything.
func TestEventFilter(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "filter")
	rRun, rAll := newReceiver(t, nil), newReceiver(t, nil)
	createEndpoint(t, reg, project, rRun, session.EventRunning)
	createEndpoint(t, reg, project, rAll, AllEvents)
	startDispatcher(t, rdb, fastOptions("t1"))

	runSessions(t, st, project, 2)
	waitFor(t, "all events", func() bool { return len(rAll.succeeded()) >= 8 })
	waitFor(t, "running events", func() bool { return len(rRun.succeeded()) >= 2 })
	time.Sleep(50 * time.Millisecond) // the point: room for a stray or duplicate request to show
	if got := rRun.all(); len(got) != 2 || got[0].Payload.Type != session.EventRunning || got[1].Payload.Type != session.EventRunning {
		t.Errorf("running-only endpoint got %+v", got)
	}
	if n := len(rAll.all()); n != 8 {
		t.Errorf("* endpoint got %d, want 8", n)
	}
	for _, q := range rAll.all() {
		if !slices.Contains(session.PublicEvents(), q.Payload.Type) {
			t.Errorf("internal event %s delivered", q.Payload.Type)
		}
	}
}

// TestRestartContinuesRetries: a dispatcher stopped while retrying leaves its queue in
// Redis; another one, under another consumer name, finishes it in order, with the events
// that came while none ran.
func TestRestartContinuesRetries(t *testing.T) {
	for _, b := range backends() {
		if b.Name == "miniredis" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) { testRestart(t, b.New(t)) })
	}
}

func testRestart(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "restart")
	down := func(int, string) int { return http.StatusServiceUnavailable }
	rcv := newReceiver(t, down)
	ep := createEndpoint(t, reg, project, rcv, AllEvents)
	stop := startDispatcher(t, rdb, fastOptions("first"))

	s1, err := runSession(st, project, 3) // pending, running, stopping
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "retries", func() bool { return len(rcv.all()) >= 3 })
	stop()
	n := len(rcv.all())

	if _, err := st.Transition(ctx, store.Change{Project: project, ID: s1, From: session.Stopping,
		To: session.Stopped, Driver: session.Node, Reason: session.Deleted}); err != nil {
		t.Fatal(err)
	}
	s2, err := runSession(st, project, 1) // another session, meanwhile
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the point: room for a stray or duplicate request to show
	if got := len(rcv.all()); got != n {
		t.Fatalf("%d requests after the dispatcher stopped", got-n)
	}
	log, _, err := reg.Deliveries(ctx, project, ep.ID, 100, "")
	if err != nil || len(log) == 0 || log[0].Status != StatusRetrying || log[0].EventType != session.EventPending {
		t.Fatalf("log before restart: %+v %v", log, err)
	}

	rcv.setPolicy(nil)
	startDispatcher(t, rdb, fastOptions("second"))
	waitFor(t, "the rest", func() bool { return len(rcv.succeeded()) >= 5 })
	time.Sleep(50 * time.Millisecond) // the point: room for a stray or duplicate request to show

	events := outbox(t, rdb, project)
	reqs := rcv.all()
	checkOrder(t, reqs, events)
	var got1, got2 []string
	for _, q := range rcv.succeeded() {
		switch q.Object.ID {
		case s1:
			got1 = append(got1, q.Payload.Type)
		case s2:
			got2 = append(got2, q.Payload.Type)
		}
	}
	if !slices.Equal(got1, publicLifecycle) || !slices.Equal(got2, []string{session.EventPending}) {
		t.Errorf("delivered %v and %v", got1, got2)
	}
	if len(rcv.succeeded()) != 5 {
		t.Errorf("%d successes, want 5", len(rcv.succeeded()))
	}
	// The first success is the retried head, at the attempt after the last failed one.
	log = deliveries(t, reg, project, ep.ID, 100)
	var failedAttempts int
	for _, d := range log {
		if d.EventType == session.EventPending && *d.SessionID == s1 && d.Status == StatusRetrying {
			failedAttempts++
		}
	}
	for _, d := range log {
		if d.EventType == session.EventPending && *d.SessionID == s1 && d.Status == StatusSucceeded && d.Attempt != failedAttempts+1 {
			t.Errorf("success at attempt %d after %d failures", d.Attempt, failedAttempts)
		}
	}
}

// TestGiveUp: an event that keeps failing past the retry window is given up, and the
// session's next event goes out after it.
func TestGiveUp(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "giveup")
	rcv := newReceiver(t, func(_ int, typ string) int {
		if typ == session.EventPending {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	ep := createEndpoint(t, reg, project, rcv, AllEvents)
	opts := fastOptions("t1")
	opts.RetryWindow = 100 * time.Millisecond
	startDispatcher(t, rdb, opts)

	if _, err := runSession(st, project, 2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "running", func() bool { return len(rcv.succeeded()) >= 1 })
	waitFor(t, "the log", func() bool {
		d, _, _ := reg.Deliveries(context.Background(), project, ep.ID, 1, "")
		return len(d) == 1 && d[0].Status == StatusSucceeded
	})
	log := deliveries(t, reg, project, ep.ID, 100)
	slices.Reverse(log)
	last := len(log) - 1
	if len(log) < 3 || log[last].EventType != session.EventRunning || log[last].Attempt != 1 ||
		log[last-1].Status != StatusGaveUp || log[last-1].EventType != session.EventPending || log[last-1].NextAttemptAt != nil {
		t.Fatalf("log %+v", log)
	}
	for _, d := range log[:last-1] {
		if d.Status != StatusRetrying || d.ResponseStatus != http.StatusInternalServerError {
			t.Errorf("attempt %+v", d)
		}
	}
	if log[last-1].CreatedAt.Sub(log[0].CreatedAt.Time) < opts.RetryWindow {
		t.Errorf("gave up after %s", log[last-1].CreatedAt.Sub(log[0].CreatedAt.Time))
	}
}

// TestEndpointDeleted: deleting an endpoint drops what was queued for it.
func TestEndpointDeleted(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "deleted")
	rcv := newReceiver(t, func(int, string) int { return http.StatusBadGateway })
	ep := createEndpoint(t, reg, project, rcv, AllEvents)
	startDispatcher(t, rdb, fastOptions("t1"))
	sid, err := runSession(st, project, 2)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "retries", func() bool { return len(rcv.all()) >= 2 })
	if err := reg.Delete(context.Background(), project, ep.ID); err != nil {
		t.Fatal(err)
	}
	k := projectKeys(project)
	waitFor(t, "the queue dropped", func() bool {
		q := queueName(ep.ID, sid)
		n, err := rdb.Exists(context.Background(), k.due(), k.queue(q), k.meta(q), k.log(ep.ID)).Result()
		return err == nil && n == 0
	})
	n := len(rcv.all())
	time.Sleep(50 * time.Millisecond) // the point: room for a stray or duplicate request to show
	if len(rcv.all()) != n {
		t.Error("deliveries go on to a deleted endpoint")
	}
}

func TestSignMatchesReference(t *testing.T) {
	secret := NewSecret()
	key, err := SecretKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"evt_1","type":"session.running"}`)
	ts := time.Now()
	ref, err := wh.Sign("evt_1", ts, body)
	if err != nil {
		t.Fatal(err)
	}
	if got := Sign(key, "evt_1", ts.Unix(), body); got != ref {
		t.Fatalf("Sign %s, reference %s", got, ref)
	}
}

func TestDefaultBackoff(t *testing.T) {
	var total time.Duration
	attempts := 0
	for total < 24*time.Hour {
		attempts++
		d := DefaultBackoff(attempts)
		if d <= 0 || d > time.Hour {
			t.Fatalf("wait %d is %s", attempts, d)
		}
		total += d
	}
	if w := DefaultBackoff(1); w < 4*time.Second || w > 5*time.Second {
		t.Errorf("first wait %s", w)
	}
	if w := DefaultBackoff(3); w < 16*time.Second || w > 20*time.Second {
		t.Errorf("third wait %s", w)
	}
	if w := DefaultBackoff(100); w < 48*time.Minute {
		t.Errorf("late wait %s", w)
	}
	if attempts > 60 {
		t.Errorf("%d attempts to cover 24 h", attempts)
	}
}

// TestBackoffUpTo: an operator's cap shortens every wait to at most the cap (so an endpoint
// that comes back is retried within it), and leaves the shorter early waits as they are.
func TestBackoffUpTo(t *testing.T) {
	b := BackoffUpTo(2 * time.Second)
	for attempt := 1; attempt < 100; attempt++ {
		if d := b(attempt); d <= 0 || d > 2*time.Second {
			t.Fatalf("wait %d is %s, want at most the cap of 2s", attempt, d)
		}
	}
	b = BackoffUpTo(time.Minute)
	if w := b(1); w < 4*time.Second || w > 5*time.Second {
		t.Errorf("first wait %s under a 1m cap, want DefaultBackoff's 4–5 s", w)
	}
	if w := b(20); w < 48*time.Second || w > time.Minute {
		t.Errorf("late wait %s under a 1m cap", w)
	}
}

// TestBackoffRange: the bounds are 5 s doubled per attempt up to the cap, less 20 %, and every
// wait BackoffUpTo draws lies within them.
func TestBackoffRange(t *testing.T) {
	for _, c := range []struct {
		attempt int
		most    time.Duration
		hi      time.Duration
	}{
		{1, DefaultMaxBackoff, 5 * time.Second}, {3, DefaultMaxBackoff, 20 * time.Second},
		{8, DefaultMaxBackoff, 640 * time.Second}, {11, DefaultMaxBackoff, time.Hour}, {50, DefaultMaxBackoff, time.Hour},
		{1, time.Second, time.Second}, {4, time.Minute, 40 * time.Second}, {5, time.Minute, time.Minute},
	} {
		lo, hi := BackoffRange(c.attempt, c.most)
		if hi != c.hi || lo != hi-hi/5 {
			t.Errorf("BackoffRange(%d, %v) = %v, %v; want %v, %v", c.attempt, c.most, lo, hi, c.hi-c.hi/5, c.hi)
		}
		b := BackoffUpTo(c.most)
		for range 200 {
			if d := b(c.attempt); d < lo || d > hi {
				t.Fatalf("BackoffUpTo(%v)(%d) = %v, outside [%v, %v]", c.most, c.attempt, d, lo, hi)
			}
		}
	}
}

func TestBuildPayload(t *testing.T) {
	rule := "no-crypto-mining"
	ev := store.Event{ID: "evt_x", Type: session.EventFailed, SessionID: "sess_1", AtMs: 1791278062118,
		Reason: session.PolicyViolation, Rule: rule, Session: &session.Session{ID: "sess_1", Object: "session", State: session.Failed}}
	b, err := BuildPayload(ev)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	data := m["data"].(map[string]any)
	if m["id"] != "evt_x" || m["type"] != session.EventFailed || m["created_at"] != "2026-10-06T09:14:22.118Z" ||
		data["reason"] != "policy_violation" || data["rule"] != rule || data["object"].(map[string]any)["id"] != "sess_1" {
		t.Errorf("payload %s", b)
	}
	ev = store.Event{ID: "evt_y", Type: session.EventSnapshotReady, AtMs: 1, Object: json.RawMessage(`{"id":"snap_1"}`), Reason: session.OOM}
	b, _ = BuildPayload(ev)
	if string(b) != `{"id":"evt_y","type":"snapshot.ready","created_at":"1970-01-01T00:00:00.001Z","data":{"object":{"id":"snap_1"}}}` {
		t.Errorf("payload %s", b)
	}
	if _, err := BuildPayload(store.Event{ID: "evt_z", Type: session.EventRunFinished, Object: json.RawMessage(`{`)}); err == nil {
		t.Error("bad object accepted")
	}
}

// TestTwoDispatchers: two dispatchers share the work; the events still arrive once each and
// in order per session.
func TestTwoDispatchers(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "two")
	r1, r2 := newReceiver(t, failFirst(3)), newReceiver(t, nil)
	createEndpoint(t, reg, project, r1, AllEvents)
	createEndpoint(t, reg, project, r2, session.EventPending, session.EventStopped)
	startDispatcher(t, rdb, fastOptions("one"))
	startDispatcher(t, rdb, fastOptions("two"))

	runSessions(t, st, project, 5)
	waitFor(t, "all events", func() bool { return len(r1.succeeded()) >= 20 && len(r2.succeeded()) >= 10 })
	time.Sleep(50 * time.Millisecond) // the point: room for a stray or duplicate request to show
	events := outbox(t, rdb, project)
	for _, r := range []*receiver{r1, r2} {
		checkOrder(t, r.all(), events)
	}
	if n1, n2 := len(r1.succeeded()), len(r2.succeeded()); n1 != 20 || n2 != 10 {
		t.Errorf("%d and %d successes, want 20 and 10", n1, n2)
	}
}

// TestTakeOver: entries read by a consumer that died, holding the outbox, are claimed once
// its hold lapses and delivered before the entries that came after them; the dead consumer
// is removed.
func TestTakeOver(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "takeover")
	rcv := newReceiver(t, nil)
	createEndpoint(t, reg, project, rcv, AllEvents)

	sid, err := runSession(st, project, 2) // pending, provisioning, running
	if err != nil {
		t.Fatal(err)
	}
	stream := store.Outbox(project)
	if err := rdb.XGroupCreateMkStream(ctx, stream, Group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	read, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: Group, Consumer: "dead",
		Streams: []string{stream, ">"}, Count: 10, Block: -1}).Result()
	if err != nil || len(read[0].Messages) != 3 {
		t.Fatalf("dead consumer read %v %v", read, err)
	}
	if err := rdb.Set(ctx, projectKeys(project).owner(), "dead/1", 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range lifecycle[2:] {
		c.Project, c.ID = project, sid
		if _, err := st.Transition(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	startDispatcher(t, rdb, fastOptions("alive"))
	waitFor(t, "all events", func() bool { return len(rcv.succeeded()) >= 4 })
	time.Sleep(50 * time.Millisecond) // the point: room for a stray or duplicate request to show
	var types []string
	for _, q := range rcv.all() {
		types = append(types, q.Payload.Type)
	}
	if !slices.Equal(types, publicLifecycle) {
		t.Errorf("delivered %v, want %v", types, publicLifecycle)
	}
	if p, err := rdb.XPending(ctx, stream, Group).Result(); err != nil || p.Count != 0 {
		t.Errorf("pending %+v %v", p, err)
	}
	// The dead consumer is gone: it would stay in the group for ever.
	cs, err := rdb.XInfoConsumers(ctx, stream, Group).Result()
	if err != nil || len(cs) != 1 || cs[0].Name != outboxConsumer {
		t.Errorf("consumers %+v %v", cs, err)
	}
}

// TestDesktopEvents: every transition of a desktop reaches the endpoints subscribed to it,
// with the desktop as data.object, in order.
func TestDesktopEvents(t *testing.T) {
	rdb := redistest.Server(t)
	st, reg := store.New(rdb), NewRegistry(rdb, RegistryOptions{AllowPrivate: true})
	project := newProject(t, st, rdb, "desktops")
	rAsleep, rAll := newReceiver(t, nil), newReceiver(t, nil)
	createEndpoint(t, reg, project, rAsleep, "desktop.asleep")
	createEndpoint(t, reg, project, rAll, AllEvents)
	startDispatcher(t, rdb, fastOptions("t1"))

	ctx := context.Background()
	now := time.Now()
	rec := desktop.Record{Desktop: desktop.Desktop{ID: session.NewID(desktop.IDPrefix, now), ProjectID: project, Name: "d",
		Size: "s", State: desktop.Starting, CreatedAt: *session.At(now)}}
	var err error
	for _, to := range []desktop.State{"", desktop.Running, desktop.Stopping, desktop.Asleep} {
		prev := rec.State
		if to == "" {
			prev = ""
		} else {
			rec.State = to
		}
		if rec, err = st.PutDesktop(ctx, rec, prev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.DeleteDesktop(ctx, project, rec.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "desktop events", func() bool { return len(rAll.succeeded()) >= 5 && len(rAsleep.succeeded()) >= 1 })
	var types []string
	for _, q := range rAll.succeeded() {
		types = append(types, q.Payload.Type)
		var d desktop.Desktop
		if err := json.Unmarshal(q.Payload.Data.Object, &d); err != nil || d.ID != rec.ID {
			t.Errorf("%s: data.object %s", q.Payload.Type, q.Payload.Data.Object)
		}
	}
	want := []string{"desktop.starting", "desktop.running", "desktop.stopping", "desktop.asleep", "desktop.deleted"}
	if !slices.Equal(types, want) {
		t.Errorf("delivered %v, want %v", types, want)
	}
	if got := rAsleep.succeeded(); len(got) != 1 || got[0].Payload.Type != "desktop.asleep" {
		t.Errorf("the desktop.asleep endpoint got %+v", got)
	}
}
