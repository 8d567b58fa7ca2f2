package node

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"wb/agent"
	"wb/hypervisor"
	"wb/internal/syncbuf"
	"wb/session"
)

// pidsDriver is oomDriver whose guest's events are the test's to send.
type pidsDriver struct {
	oomDriver
	events chan hypervisor.Event
}

func (d pidsDriver) Events(context.Context, string) (<-chan hypervisor.Event, error) {
	return d.events, nil
}

// pidsNode is a node whose one running session, id, has for its guest's agent endH at POST
// /v1/procs/end (404 elsewhere), and whose guest's events the test sends on the channel
// answered; the node watches them.
func pidsNode(t *testing.T, id string, m *Metrics, endH http.HandlerFunc) (*live, chan<- hypervisor.Event, *syncbuf.Buffer) {
	t.Helper()
	events := make(chan hypervisor.Event)
	n, _, logs := hostileAgentNode(t, id, Config{Driver: pidsDriver{oomDriver{kills: &atomic.Int64{}}, events}, Metrics: m},
		func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/v1/procs/end" {
				endH(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"no route"}}`))
		})
	n.mu.Lock()
	l := n.guests[id]
	n.mu.Unlock()
	l.mu.Lock()
	ctx, guestID := n.beginWatch(l)
	l.mu.Unlock()
	n.startWatch(ctx, l, guestID)
	return l, events, logs
}

func pidsEvent(cur int) hypervisor.Event {
	return hypervisor.Event{Type: hypervisor.EventPids, At: time.Now(), Detail: fmt.Sprintf("pids.current=%d of pids.max=12416", 6208+cur*1552)}
}

// pollUntil polls cond for up to a minute (a loaded host), failing with what.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

// TestSandboxPidsEndsTheGuestsProcesses: a pids event (the guest's sandbox nears its host
// process limit) has the node ask the guest's agent to end every process of the guest, once
// at a time: the events that come while the agent works on it ask nothing more; the session
// runs on, the node logs what was ended and why and counts it, and a later event (the count
// grew on) asks again.
func TestSandboxPidsEndsTheGuestsProcesses(t *testing.T) {
	const id = "sess_pidsends"
	m := NewMetrics()
	var asked atomic.Int32
	release := make(chan struct{})
	l, events, logs := pidsNode(t, id, m, func(w http.ResponseWriter, r *http.Request) {
		if asked.Add(1) == 1 {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ended":212}` + "\n"))
	})
	for i := range 3 {
		events <- pidsEvent(i) // taken by the node's watch: the first is being answered after it
	}
	pollUntil(t, "the first request", func() bool { return asked.Load() >= 1 })
	time.Sleep(200 * time.Millisecond) // room for a wrong second request
	if n := asked.Load(); n != 1 {
		t.Fatalf("3 pids events while the agent ended the processes: %d requests; want 1", n)
	}
	close(release)
	pollUntil(t, "the node's log of the end", func() bool { return strings.Contains(logs.String(), "its agent ended every process of the guest") })
	if !strings.Contains(logs.String(), "ended=212") || !strings.Contains(logs.String(), "session="+id) {
		t.Errorf("the node's log does not say which session and how many were ended:\n%s", logs.String())
	}
	pollUntil(t, "the request to end", func() bool { return !endInFlight(&l.ending) })
	events <- pidsEvent(3)
	pollUntil(t, "a second request after the count grew on", func() bool { return asked.Load() == 2 })
	pollUntil(t, "the second end", func() bool { return !endInFlight(&l.ending) })
	l.mu.Lock()
	st := l.g.State
	l.mu.Unlock()
	if st != session.Running {
		t.Errorf("after its processes were ended the session is %s; want running", st)
	}
	if got := scrapeMetrics(m, "wb_node_guest_process_ends"); !strings.Contains(got+"\n", `wb_node_guest_process_ends_total{outcome="ended"} 2`+"\n") {
		t.Errorf("/metrics lacks 2 ends:\n%s", got)
	}
}

// TestSandboxPidsOlderAgent: an agent from before POST /v1/procs/end (a guest adopted from
// an older node) answers 404; the node leaves the session running, logs why and counts it, and
// asks that guest's agent nothing more. A sandbox's host tasks do not fall back once its
// processes end (sandboxPids), so one that an older agent's guard saved from a bomb may sit
// past half its limit for good: stopping it at its new node's first look failed a session
// that ran on under the old node.
func TestSandboxPidsOlderAgent(t *testing.T) {
	const id = "sess_pidsolder"
	m := NewMetrics()
	var asked atomic.Int32
	l, events, logs := pidsNode(t, id, m, func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"no route POST /v1/procs/end"}}` + "\n"))
	})
	events <- pidsEvent(0)
	pollUntil(t, "the node's log of the agent that cannot", func() bool {
		return strings.Contains(logs.String(), "its agent cannot end the guest's processes")
	})
	pollUntil(t, "the request to end", func() bool { return !endInFlight(&l.ending) })
	events <- pidsEvent(1) // the count grew on
	time.Sleep(200 * time.Millisecond)
	l.mu.Lock()
	st, reason := l.g.State, l.g.Reason
	l.mu.Unlock()
	if st != session.Running {
		t.Errorf("an older agent's guest near its limit: the session is %s (%s); want running", st, reason)
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the older agent was asked %d times; want once", n)
	}
	if got := scrapeMetrics(m, "wb_node_guest_process_ends"); !strings.Contains(got+"\n", `wb_node_guest_process_ends_total{outcome="unsupported"} 1`+"\n") {
		t.Errorf("/metrics lacks the agent that cannot:\n%s", got)
	}
}

// endInFlight reports whether e has a request in flight.
func endInFlight(e *procEnd) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cancel != nil
}

// stopCountingDriver is pidsDriver that counts its guests' stops.
type stopCountingDriver struct {
	pidsDriver
	stops *atomic.Int32
}

func (d stopCountingDriver) Stop(context.Context, string) error {
	d.stops.Add(1)
	return nil
}

// TestSandboxPidsStopsADirectGuest: a direct guest (a tier-1 run's, no agent) whose sandbox
// nears its host process limit is stopped, its run with it, and counted so; before, the node
// only logged that its processes were "being ended already" while the bomb went on to the
// sandbox's limit.
func TestSandboxPidsStopsADirectGuest(t *testing.T) {
	const id = "sess_pidsdirect"
	m := NewMetrics()
	stops := &atomic.Int32{}
	events := make(chan hypervisor.Event)
	n, _, _ := hostileAgentNode(t, id, Config{Driver: stopCountingDriver{pidsDriver{oomDriver{kills: &atomic.Int64{}}, events}, stops}, Metrics: m},
		func(w http.ResponseWriter, r *http.Request) {
			t.Errorf("a direct guest's agent was asked %s %s", r.Method, r.URL.Path)
		})
	n.mu.Lock()
	l := n.guests[id]
	n.mu.Unlock()
	dg, err := agent.NewDirectGuest("/", nil, func() {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dg.Close)
	l.mu.Lock()
	l.agent, l.direct = nil, dg
	ctx, guestID := n.beginWatch(l)
	l.mu.Unlock()
	n.startWatch(ctx, l, guestID)
	events <- pidsEvent(0)
	pollUntil(t, "the direct guest's stop", func() bool { return stops.Load() >= 1 })
	if got := testutil.ToFloat64(m.ends.WithLabelValues("stopped")); got != 1 {
		t.Errorf("wb_node_guest_process_ends_total{outcome=stopped} = %v, want 1", got)
	}
}
