package chaos_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/client"
	"wb/session"
)

// arrival is one delivery attempt a receiver saw.
type arrival struct {
	id, typ, session string
	created, at      time.Time
	refused          bool
}

// receiver is a webhook endpoint on loopback that refuses (503) while down.
type receiver struct {
	srv  *httptest.Server
	down atomic.Bool
	mu   sync.Mutex
	seen []arrival
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var p struct {
			ID        string    `json:"id"`
			Type      string    `json:"type"`
			CreatedAt time.Time `json:"created_at"`
			Data      struct {
				Object struct {
					ID string `json:"id"`
				} `json:"object"`
			} `json:"data"`
		}
		_ = json.Unmarshal(b, &p)
		a := arrival{id: p.ID, typ: p.Type, session: p.Data.Object.ID, created: p.CreatedAt, at: time.Now(), refused: r.down.Load()}
		r.mu.Lock()
		r.seen = append(r.seen, a)
		r.mu.Unlock()
		if a.refused {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// delivered answers, per session of ids, the events first accepted, in order of arrival.
func (r *receiver) delivered(ids []string) (map[string][]arrival, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]arrival{}
	seen := map[string]bool{}
	refused := 0
	for _, a := range r.seen {
		if !slices.Contains(ids, a.session) {
			continue
		}
		if a.refused {
			refused++
			continue
		}
		if !seen[a.id] {
			seen[a.id] = true
			out[a.session] = append(out[a.session], a)
		}
	}
	return out, refused
}

// webhookReceiverDown: one endpoint stays up (the control), another refuses every delivery
// with 503 for the timings' receiverDown (short: 20 s, the gateways' waits capped at 1 s; real:
// the ten minutes with wb's default waits, up to an hour) while sessions go from
// pending to stopped, then comes back. Each event the control got reaches it afterwards, none
// lost, in the control's order per session and in order of created_at, within deliveredWithin
// of its return: the longest wait the backoff can be in at the outage's end (timings.go;
// short: 1 s, where the default waits would first retry 28 s or more after the outage's start
// and fail it; real: 640 s), and slack.
func (e *env) webhookReceiverDown(t *testing.T) {
	receiverDown, deliveredWithin := e.tm.receiverDown, e.tm.deliveredWithin()
	events := []string{session.EventPending, session.EventRunning, session.EventStopping, session.EventStopped}
	control, flaky := newReceiver(t), newReceiver(t)
	flaky.down.Store(true)
	for _, r := range []*receiver{control, flaky} {
		ep, err := e.c[0].CreateWebhookEndpoint(e.bg, client.CreateWebhookEndpointRequest{URL: r.srv.URL + "/hook", Events: events})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = e.c[0].DeleteWebhookEndpoint(e.bg, ep.ID) })
	}
	downAt := time.Now()

	// Four sessions through both gateways, from pending to stopped, while the receiver is down.
	var ids []string
	for i := range 4 {
		ids = append(ids, e.create(t, i, "").ID)
	}
	for i, id := range ids {
		e.waitState(t, i, id, 2*time.Minute, session.Running)
	}
	for _, id := range ids {
		e.delete(t, id)
	}
	if time.Since(downAt) > receiverDown {
		t.Logf("the sessions' lifecycles took %v, longer than the outage of %v", time.Since(downAt), receiverDown)
	}
	time.Sleep(time.Until(downAt.Add(receiverDown)))
	flaky.down.Store(false)
	upAt := time.Now()

	// The control has every event (it was up); the flaky one must catch up.
	var want, got map[string][]arrival
	var refused int
	for deadline := time.Now().Add(deliveredWithin + time.Minute); ; time.Sleep(100 * time.Millisecond) {
		want, _ = control.delivered(ids)
		got, refused = flaky.delivered(ids)
		complete := true
		for _, id := range ids {
			w := want[id]
			if len(w) == 0 || w[len(w)-1].typ != session.EventStopped || len(got[id]) < len(w) {
				complete = false
			}
		}
		if complete || time.Now().After(deadline) {
			break
		}
	}
	var total int
	var slowest time.Duration
	for _, id := range ids {
		w, g := want[id], got[id]
		total += len(g)
		if len(w) == 0 || w[len(w)-1].typ != session.EventStopped {
			t.Errorf("session %s: the receiver that stayed up got %v, want its events up to %s", id, typesOf(w), session.EventStopped)
		}
		if !slices.Equal(idsOf(g), idsOf(w)) {
			t.Errorf("session %s: after the outage the receiver got %v, the one that stayed up %v (lost or out of order)", id, typesOf(g), typesOf(w))
		}
		for i, a := range g {
			if i > 0 && a.created.Before(g[i-1].created) {
				t.Errorf("session %s: %s (created %v) arrived after %s (created %v)", id, a.typ, a.created, g[i-1].typ, g[i-1].created)
			}
			if a.at.Before(upAt) {
				t.Errorf("session %s: %s was accepted at %v, while the receiver was down", id, a.typ, a.at)
			}
			slowest = max(slowest, a.at.Sub(upAt.Add(max(0, a.created.Sub(upAt)))))
		}
	}
	e.figure(t, "webhook receiver down for %v (the issue's ten minutes; waits between attempts capped at %v): %d events of %d sessions delivered after, none lost, in order per session; the last %.1fs after the receiver was back (bound %v: the longest wait in force, %v, and %v); %d attempts refused during the outage",
		receiverDown, e.tm.maxBackoff(), total, len(ids), slowest.Seconds(), deliveredWithin, e.tm.retriedWithin(), pickupSlack, refused)
	if slowest > deliveredWithin {
		t.Errorf("an event arrived %v after the receiver was back, want within %v", slowest, deliveredWithin)
	}
}

func idsOf(as []arrival) []string {
	var s []string
	for _, a := range as {
		s = append(s, a.id)
	}
	return s
}

func typesOf(as []arrival) string {
	var s []string
	for _, a := range as {
		s = append(s, a.typ)
	}
	return "[" + strings.Join(s, " ") + "]"
}
