package chaos_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/client"
	"wb/internal/fleet"
	"wb/session"
	"wb/store"
)

const (
	// timerMargin and teardown are the node tests' margins (node/node_test.go): a timer
	// fires within 5 s of its deadline on a loaded machine, and the guest's teardown, which
	// stopped_at follows, takes up to 10 s more.
	timerMargin = 5 * time.Second
	teardown    = 10 * time.Second
)

// TestGateways starts a fleet of its own, whose nodes have room for 24 sessions of size s,
// and, in order: gateway 1 killed with SIGKILL while 20 clients create sessions through it,
// each client then retrying its request with its own Idempotency-Key on gateway 2 until it
// has an answer: each key has exactly one session, all run, and nothing is left after they
// are deleted; then both gateways killed while the nodes run sessions with short idle and
// lifetime timers: the nodes stop the guests at their deadlines, and once the gateways are
// back the API shows each session ended for its timer, with its events in order and its
// usage settled once. (A fleet of its own: TestFleet's nodes hold six sessions.)
func TestGateways(t *testing.T) {
	t.Parallel()
	e := startFleet(t, func(o *fleet.Options) { o.NodeVCPU, o.NodeMemoryMiB = 8, 16384 })
	t.Run("gateway killed while creating", e.gatewayKilled)
	t.Run("control plane down", e.controlPlaneDown)
}

// answer is one POST /v1/sessions: its status, the session's id (201) or the error's code
// and message.
type answer struct {
	status        int
	id, code, msg string
}

// post sends POST /v1/sessions with body and Idempotency-Key key to gateway gw, once.
func (e *env) post(ctx context.Context, gw int, key string, body []byte) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", e.f.GatewayURLs[gw]+"/v1/sessions", bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+e.f.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{status: resp.StatusCode}
	var out struct {
		ID    string `json:"id"`
		Error struct {
			Code, Message string
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return a, fmt.Errorf("%s: %w: %q", resp.Status, err, b)
	}
	a.id, a.code, a.msg = out.ID, out.Error.Code, out.Error.Message
	return a, nil
}

// idemState reads the Idempotency-Key's record in Redis (store/keys.go: the project's
// "idem:" + the key's SHA-256): "" (none), "in flight" or "done"; and its ref.
func (e *env) idemState(t *testing.T, key string) (state, ref string) {
	t.Helper()
	sum := sha256.Sum256([]byte(key))
	raw, err := e.f.Redis.Get(e.bg, "wb:{"+project+"}:idem:"+hex.EncodeToString(sum[:])).Bytes()
	if errors.Is(err, redis.Nil) {
		return "", ""
	}
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Done bool   `json:"done"`
		Ref  string `json:"ref"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatalf("idempotency record of %s: %v", key, err)
	}
	if rec.Done {
		return "done", rec.Ref
	}
	return "in flight", rec.Ref
}

func (e *env) gatewayKilled(t *testing.T) {
	const clients = 20
	killAfter := clients / 2 // creates sent to gateway 1 when it is killed
	body := []byte(`{"tier":2,"resources":{"size_class":"s"},"idle_timeout_s":1200,"max_lifetime_s":3600}`)
	ctx, cancel := context.WithTimeout(e.bg, 5*time.Minute)
	defer cancel()
	// A client has its answer within the dead gateway's lease and a loaded machine's slack.
	const answerWithin = time.Minute
	run := strconv.FormatInt(time.Now().UnixNano(), 36)

	type caller struct {
		key           string
		first         answer // gateway 1's, when it answered before its death
		firstErr      error
		id            string
		retries, held int // attempts on gateway 2; of them, 409s while the dead one's lease ran
		took          time.Duration
		err           error
	}
	cs := make([]caller, clients)
	var sent atomic.Int32
	var killing sync.Once
	startKill := make(chan struct{})
	killed := make(chan struct{}) // closed once the kill is done and the records read
	release := sync.OnceFunc(func() { close(killed) })
	defer release() // a t.Fatal below must not leave the clients waiting
	var wg sync.WaitGroup
	for i := range cs {
		c := &cs[i]
		c.key = fmt.Sprintf("chaos-gw-%s-%02d", run, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 3 * time.Millisecond) // staggered: the kill lands mid-way
			start := time.Now()
			if int(sent.Add(1)) == killAfter {
				killing.Do(func() { close(startKill) })
			}
			c.first, c.firstErr = e.post(ctx, 0, c.key, body)
			<-killed
			// Retry on the survivor until it answers: every client, also those gateway 1
			// answered (their answer must be the same session).
			for {
				c.retries++
				a, err := e.post(ctx, 1, c.key, body)
				switch {
				case err == nil && a.status == 201:
					c.id, c.took = a.id, time.Since(start)
					return
				case err == nil && a.status == 409 && a.code == "idempotency_key_reused" && strings.Contains(a.msg, "in progress"):
					c.held++ // the dead gateway's claim holds until its lease lapses
				case err == nil && (a.status == 429 || a.status == 503):
				case err != nil && ctx.Err() == nil:
				default:
					c.err = fmt.Errorf("gateway 2 answered %+v, %v", a, err)
					return
				}
				if time.Since(start) > answerWithin || ctx.Err() != nil {
					c.err = fmt.Errorf("no answer within %v of the first attempt (%d retries, %d \"in progress\")", answerWithin, c.retries, c.held)
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		}()
	}
	<-startKill
	sentBefore := sent.Load()
	if err := e.f.KillGateway(0); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	// What the kill left: keys whose claim is in flight (no answer recorded, the lease no
	// longer renewed), and of them those whose session the dead gateway had written.
	var orphaned, written int
	for i := range cs { // only the keys: the clients write the rest meanwhile
		state, ref := e.idemState(t, cs[i].key)
		if state == "in flight" {
			orphaned++
			if n, err := e.f.Redis.Exists(e.bg, "wb:{"+project+"}:s:sess_"+ref).Result(); err == nil && n == 1 {
				written++
			}
		}
	}
	release()
	wg.Wait()

	var answered, cut, refused int
	ids := map[string]string{} // session → key
	var took []time.Duration
	var held int
	for _, c := range cs {
		held += c.held
		switch {
		case c.firstErr == nil && c.first.status == 201:
			answered++
		case c.firstErr != nil && strings.Contains(c.firstErr.Error(), "connection refused"):
			refused++
		default:
			cut++
		}
		if c.err != nil {
			t.Errorf("client %s: %v", c.key, c.err)
			continue
		}
		if c.first.status == 201 && c.first.id != c.id {
			t.Errorf("client %s: gateway 1 answered %s, gateway 2 %s: two sessions for one key", c.key, c.first.id, c.id)
		}
		if other, dup := ids[c.id]; dup {
			t.Errorf("keys %s and %s both answered session %s", other, c.key, c.id)
		}
		ids[c.id] = c.key
		took = append(took, c.took)
	}
	if t.Failed() {
		t.FailNow()
	}

	// The project's sessions, through the API: these and no other (the fleet is new).
	var listed []string
	for cursor := ""; ; {
		page, err := e.c[1].ListSessions(ctx, client.ListSessionsRequest{Page: client.Page{Limit: 100, Cursor: cursor}})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page.Data {
			listed = append(listed, s.ID)
		}
		if page.NextCursor == nil || *page.NextCursor == "" {
			break
		}
		cursor = *page.NextCursor
	}
	var extra []string
	for _, id := range listed {
		if _, ok := ids[id]; !ok {
			extra = append(extra, id)
		}
	}
	if len(listed) != clients || len(extra) > 0 {
		t.Fatalf("the project has %d sessions for %d keys; not answered to any client: %v", len(listed), clients, extra)
	}
	for _, c := range cs {
		if state, _ := e.idemState(t, c.key); state != "done" {
			t.Errorf("key %s: its record is %q after its answer, want done", c.key, state)
		}
	}

	// Each runs, or (placed by the dead gateway's placer, which died before the node heard)
	// fails at its provisioning deadline with its reason; each running one holds one slot.
	var running []string
	failed := map[string]int{}
	for id := range ids {
		s := e.waitState(t, 1, id, 2*time.Minute, session.Running, session.Failed, session.Stopped, session.Expired)
		switch {
		case s.State == session.Running:
			running = append(running, id)
		case reasonOf(s) == "":
			t.Errorf("session %s is %s with no reason", id, s.State)
		default:
			failed[string(s.State)+" ("+reasonOf(s)+")"]++
		}
	}
	if n := e.activeSlots(t); n != int64(len(running)) {
		t.Errorf("the project holds %d slots with %d sessions running", n, len(running))
	}

	slices.Sort(took)
	pct := func(p float64) time.Duration { return took[min(len(took)-1, int(p*float64(len(took))))] }
	e.figure(t, "%d clients, gateway 1 killed after %d creates were sent (%d answered, %d cut off, %d refused); "+
		"the kill left %d keys in flight, %d of them with their session written: %d sessions, 0 duplicates; "+
		"first attempt to answer p50 %.1fs, p99 %.1fs (lease %v), retries on gateway 2: up to %d, %d answered \"in progress\"; %d run, ended: %v",
		clients, sentBefore, answered, cut, refused, orphaned, written, len(ids), pct(0.5).Seconds(), pct(0.99).Seconds(),
		store.DefaultIdemLease, slices.MaxFunc(cs, func(a, b caller) int { return a.retries - b.retries }).retries, held, len(running), failed)

	// Gateway 1 comes back and replays what gateway 2 answered.
	if err := e.f.RestartGateway(ctx, 0); err != nil {
		t.Fatal(err)
	}
	e.figure(t, "gateway 1 back %.1fs after the kill", time.Since(killedAt).Seconds())
	for _, c := range cs[:3] {
		if a, err := e.post(ctx, 0, c.key, body); err != nil || a.status != 201 || a.id != c.id {
			t.Errorf("key %s on the restarted gateway 1: %+v, %v; want 201 with %s", c.key, a, err, c.id)
		}
	}

	// Deleted, nothing is left: no slot, no guest.
	for _, id := range running {
		e.delete(t, id)
	}
	if n := e.activeSlots(t); n != 0 {
		t.Errorf("the project holds %d slots after deleting every session", n)
	}
	e.waitNoGuests(t, time.Minute)
}

// waitNoGuests waits until no node has a guest.
func (e *env) waitNoGuests(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := map[string][]string{}
		for _, n := range e.f.Nodes {
			ids, err := e.f.Guests(e.bg, n)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) > 0 {
				left[n.ID] = ids
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("guests left %v after their sessions ended: %v", within, left)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// hook is a webhook receiver: every delivery it got, each event once (by its id), in the
// order they came.
type hook struct {
	mu   sync.Mutex
	seen map[string]bool
	got  []delivered
}

type delivered struct {
	typ, session string
	at, came     time.Time // the event's time; when it was delivered
}

func (h *hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var p struct {
		ID        string       `json:"id"`
		Type      string       `json:"type"`
		CreatedAt session.Time `json:"created_at"`
		Data      struct {
			Object struct {
				ID string `json:"id"`
			} `json:"object"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.seen[p.ID] {
		h.seen[p.ID] = true
		h.got = append(h.got, delivered{typ: p.Type, session: p.Data.Object.ID, at: p.CreatedAt.Time, came: time.Now()})
	}
}

// of answers the session's deliveries so far.
func (h *hook) of(id string) []delivered {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []delivered
	for _, d := range h.got {
		if d.session == id {
			out = append(out, d)
		}
	}
	return out
}

func (e *env) controlPlaneDown(t *testing.T) {
	type timed struct {
		idleS, lifeS int
		end          session.State
		reason       session.Reason
		events       []string
		s            *session.Session
		deadline     time.Time
	}
	idle := func() *timed {
		return &timed{idleS: 30, lifeS: 3600, end: session.Stopped, reason: session.IdleTimeout,
			events: []string{session.EventPending, session.EventProvisioning, session.EventRunning, session.EventIdleWarning,
				session.EventStopping, session.EventStopped}}
	}
	lifetime := &timed{idleS: 120, lifeS: 60, end: session.Expired, reason: session.MaxLifetime,
		events: []string{session.EventPending, session.EventProvisioning, session.EventRunning, session.EventLifetimeWarning,
			session.EventStopping, session.EventExpired}}
	ss := []*timed{idle(), idle(), lifetime}

	// A webhook endpoint on every event: it hears what happened during the outage after.
	h := &hook{seen: map[string]bool{}}
	recv := httptest.NewServer(h)
	defer recv.Close()
	ctx, cancel := context.WithTimeout(e.bg, 5*time.Minute)
	defer cancel()
	ep, err := e.c[0].CreateWebhookEndpoint(ctx, client.CreateWebhookEndpointRequest{URL: recv.URL, Events: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range ss {
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		s, err := e.c[i%2].CreateSession(cctx, client.CreateSessionRequest{Tier: 2, Resources: &client.ResourceRequest{SizeClass: "s"},
			IdleTimeoutS: x.idleS, MaxLifetimeS: x.lifeS})
		ccancel()
		if err != nil {
			t.Fatal(err)
		}
		x.s = s
	}
	for i, x := range ss {
		x.s = e.waitState(t, i, x.s.ID, 2*time.Minute, session.Running)
		x.deadline = x.s.StartedAt.Add(time.Duration(min(x.idleS, x.lifeS)) * time.Second)
		if x.deadline.Before(time.Now().Add(5 * time.Second)) {
			t.Fatalf("session %s took until %v before its deadline to run: no time to kill the gateways", x.s.ID, time.Until(x.deadline))
		}
	}

	for i := range e.f.GatewayURLs {
		if err := e.f.KillGateway(i); err != nil {
			t.Fatal(err)
		}
	}
	down := time.Now()
	// While no gateway runs, each guest is gone from its node by its deadline plus the
	// timer's margin and the teardown, and the node wrote the session's end to the outbox
	// (no dispatcher reads it meanwhile) when its timer fired.
	byDeadline := slices.SortedFunc(slices.Values(ss), func(a, b *timed) int { return a.deadline.Compare(b.deadline) })
	for _, x := range byDeadline {
		time.Sleep(time.Until(x.deadline.Add(timerMargin + teardown)))
		n := e.nodeOf(t, x.s)
		ids, err := e.f.Guests(e.bg, n)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(ids, x.s.ID) {
			t.Errorf("the control plane is down and %s's deadline passed %v ago, yet its guest is on %s: %v",
				x.s.ID, timerMargin+teardown, n.ID, ids)
		}
	}
	var figures []string
	for _, x := range ss {
		var types []string
		var stopping, end *store.Event
		for _, ev := range e.sessionEvents(t, x.s.ID) {
			types = append(types, ev.Type)
			switch ev.Type {
			case session.EventStopping:
				stopping = &ev
			case x.events[len(x.events)-1]:
				end = &ev
			}
		}
		if stopping == nil || end == nil {
			t.Errorf("the control plane is down past %s's deadline, and its outbox holds %v: no %s and %s",
				x.s.ID, types, session.EventStopping, x.events[len(x.events)-1])
			continue
		}
		inWindow(t, x.s.ID+" session.stopping", time.UnixMilli(stopping.AtMs), x.deadline, x.deadline.Add(timerMargin))
		figures = append(figures, fmt.Sprintf("%s (%ds) stopping %+.1fs, %s %+.1fs", x.reason, min(x.idleS, x.lifeS),
			time.UnixMilli(stopping.AtMs).Sub(x.deadline).Seconds(), end.Type, time.UnixMilli(end.AtMs).Sub(x.deadline).Seconds()))
	}
	e.figure(t, "gateways down; the nodes' timers fired, after their deadlines: %s", strings.Join(figures, "; "))

	back := time.Now() // the first gateway back delivers what the outage left
	for i := range e.f.GatewayURLs {
		if err := e.f.RestartGateway(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	downFor := back.Sub(down)

	// Through the API: each ended for its timer, at its deadline; every event delivered,
	// in order, those of the outage after it; its usage settled once.
	figures = nil
	for i, x := range ss {
		end := e.waitState(t, i, x.s.ID, 30*time.Second, session.Stopped, session.Expired, session.Failed)
		if end.State != x.end || reasonOf(end) != string(x.reason) {
			t.Errorf("session %s is %s (%s), want %s (%s)", x.s.ID, end.State, reasonOf(end), x.end, x.reason)
			continue
		}
		if end.StoppedAt == nil {
			t.Errorf("session %s: no stopped_at", x.s.ID)
			continue
		}
		inWindow(t, x.s.ID+" stopped_at", end.StoppedAt.Time, x.deadline, x.deadline.Add(timerMargin+teardown))
		var got []delivered
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if got = h.of(x.s.ID); len(got) >= len(x.events)-1 || time.Now().After(deadline) {
				break
			}
		}
		var types []string
		for _, d := range got {
			types = append(types, d.typ)
		}
		// Every public event (session.provisioning is the platform's own).
		want := slices.DeleteFunc(slices.Clone(x.events), func(typ string) bool { return !slices.Contains(session.PublicEvents(), typ) })
		if !slices.Equal(types, want) {
			t.Errorf("session %s: delivered %v, want %v", x.s.ID, types, want)
			continue
		}
		outage := got[slices.Index(types, session.EventRunning)+1:]
		for _, d := range outage { // the timers' events: written during the outage
			if d.came.Before(back) || d.at.After(back) {
				t.Errorf("session %s: %s of %s delivered at %s; the gateways were down until %s",
					x.s.ID, d.typ, d.at.Format("15:04:05.000"), d.came.Format("15:04:05.000"), back.Format("15:04:05.000"))
			}
		}
		recorded := e.recordedMs(t, x.s.ID)
		settled := e.settledMs(t, x.s.ID, recorded)
		if settled != recorded {
			t.Errorf("session %s: settled %d ms, its usage records sum to %d ms", x.s.ID, settled, recorded)
		}
		if ran := end.StoppedAt.Sub(x.s.StartedAt.Time); time.Duration(settled)*time.Millisecond > ran+time.Second {
			t.Errorf("session %s: billed %d ms, but it ran %v", x.s.ID, settled, ran)
		}
		figures = append(figures, fmt.Sprintf("%s %s (%s) stopped_at %+.1fs after the deadline, its %d events delivered in order (%d after the restart, within %.1fs), %d ms settled",
			x.s.ID, end.State, reasonOf(end), end.StoppedAt.Sub(x.deadline).Seconds(), len(got), len(outage), got[len(got)-1].came.Sub(back).Seconds(), settled))
	}
	time.Sleep(5 * time.Second) // longer than a node's usage flush: a second settlement shows
	for _, x := range ss {
		if again, recorded := e.settledMs(t, x.s.ID, -1), e.recordedMs(t, x.s.ID); again != recorded {
			t.Errorf("session %s: settled %d ms, records %d ms, after the replay", x.s.ID, again, recorded)
		}
	}
	if n := e.activeSlots(t); n != 0 {
		t.Errorf("the project holds %d slots after every session ended", n)
	}
	e.waitNoGuests(t, 30*time.Second)
	if _, err := e.c[0].DeleteWebhookEndpoint(ctx, ep.ID); err != nil {
		t.Error(err)
	}
	e.figure(t, "both gateways down %.1fs while %d sessions ran; after the restart: %s",
		downFor.Seconds(), len(ss), strings.Join(figures, "; "))
}

// sessionEvents answers the session's events in the project's outbox, in order.
func (e *env) sessionEvents(t *testing.T, id string) []store.Event {
	t.Helper()
	all, err := store.New(e.f.Redis).OutboxEvents(e.bg, project)
	if err != nil {
		t.Fatal(err)
	}
	var out []store.Event
	for _, ev := range all {
		if ev.SessionID == id {
			out = append(out, ev)
		}
	}
	return out
}

// inWindow fails unless lo ≤ got ≤ hi.
func inWindow(t *testing.T, what string, got, lo, hi time.Time) {
	t.Helper()
	if got.Before(lo) || got.After(hi) {
		t.Errorf("%s at %s, want within [%s, %s] (%+.3fs from the window's start)", what,
			got.Format("15:04:05.000"), lo.Format("15:04:05.000"), hi.Format("15:04:05.000"), got.Sub(lo).Seconds())
	}
}
