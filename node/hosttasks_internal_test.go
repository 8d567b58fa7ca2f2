package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/internal/syncbuf"
	"wb/session"
)

// TestPickHog: the guest taken near the host's process total is the biggest above the share
// (the total's limit over the guests holding tasks), this node's and running a session; a
// bigger guest of another node is left to that node while deferOthers.
func TestPickHog(t *testing.T) {
	own := func(id string, n int64) hypervisor.GuestTasks {
		return hypervisor.GuestTasks{ID: id, Own: true, Tasks: n}
	}
	other := func(id string, n int64) hypervisor.GuestTasks { return hypervisor.GuestTasks{ID: id, Tasks: n} }
	all := func(string) bool { return true }
	for _, c := range []struct {
		name     string
		guests   []hypervisor.GuestTasks
		limit    int64
		runnable func(string) bool
		defers   bool
		want     string // the guest taken, "" none
		wantWhy  string
		share    int64
	}{
		{name: "three ratcheted sandboxes of one tenant and two bystanders", limit: 28672, runnable: all, defers: true,
			guests: []hypervisor.GuestTasks{own("by1", 60), own("hog2", 8900), own("hog1", 9800), other("n2/by2", 140), own("hog3", 6100)},
			want:   "hog1", share: 5734},
		{name: "an even split takes none", limit: 28672, runnable: all,
			guests: []hypervisor.GuestTasks{own("a", 1024), own("b", 1024), other("n2/c", 1024)}, share: 9557,
			wantWhy: "holds more than the share of 9557"},
		{name: "at the share exactly is not above it", limit: 300, runnable: all,
			guests: []hypervisor.GuestTasks{own("a", 150), own("b", 150)}, share: 150, wantWhy: "share of 150"},
		{name: "a bigger guest of another node is left to it", limit: 1000, runnable: all, defers: true,
			guests: []hypervisor.GuestTasks{own("mine", 400), other("n2/theirs", 500), own("by", 20)}, share: 333,
			wantWhy: "another node's (n2/theirs)"},
		{name: "past the deferral this node takes its own biggest above the share", limit: 1000, runnable: all,
			guests: []hypervisor.GuestTasks{own("mine", 400), other("n2/theirs", 500), own("by", 20)}, share: 333,
			want: "mine"},
		{name: "past the deferral, but its own are under the share", limit: 1000, runnable: all,
			guests: []hypervisor.GuestTasks{own("mine", 300), other("n2/theirs", 600), own("by", 20)}, share: 333,
			wantWhy: "share of 333"},
		{name: "a bigger guest of this node that runs no session (stopping) is waited for", limit: 1000,
			runnable: func(id string) bool { return id != "stopping" }, defers: true,
			guests: []hypervisor.GuestTasks{own("stopping", 700), own("next", 400), own("by", 20)}, share: 333,
			wantWhy: "stopping, runs no session now"},
		{name: "past the deferral a guest that runs no session is passed over", limit: 1000,
			runnable: func(id string) bool { return id != "stopping" },
			guests:   []hypervisor.GuestTasks{own("stopping", 700), own("next", 400), own("by", 20)}, share: 333,
			want: "next"},
		{name: "one guest alone is never above its share", limit: 1000, runnable: all,
			guests: []hypervisor.GuestTasks{own("a", 990)}, share: 1000, wantWhy: "share of 1000"},
		{name: "no guests", limit: 1000, runnable: all, share: 1000, wantWhy: "share"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := append([]hypervisor.GuestTasks(nil), c.guests...)
			hog, share, why := pickHog(c.guests, c.limit, c.runnable, c.defers)
			if hog.ID != c.want || share != c.share || c.want == "" && !strings.Contains(why, c.wantWhy) {
				t.Errorf("pickHog: %+v, share %d, why %q; want %q, share %d, why containing %q", hog, share, why, c.want, c.share, c.wantWhy)
			}
			for i := range before {
				if c.guests[i] != before[i] {
					t.Fatalf("pickHog reordered its argument: %v", c.guests)
				}
			}
		})
	}
}

// tasksDriver is a HostTasker whose guests' counts are the test's: the guests hold cur of
// limit, and guests lists them; each guest holds what guests says, for good (a runsc
// sandbox's count does not fall).
type tasksDriver struct {
	oomDriver
	cur     *atomic.Int64
	limit   int64
	guests  []hypervisor.GuestTasks
	stopped *atomic.Bool // a guest was stopped: its tasks went
}

func (d tasksDriver) Stop(context.Context, string) error { d.stopped.Store(true); return nil }

func (d tasksDriver) GuestsTotal() (int64, int64, error) { return d.cur.Load(), d.limit, nil }

func (d tasksDriver) GuestsTasks(context.Context) ([]hypervisor.GuestTasks, error) {
	return slices.Clone(d.guests), nil
}

func (d tasksDriver) GuestTasks(_ context.Context, id string) (int64, error) {
	if d.stopped.Load() {
		return 0, errors.New("no such guest")
	}
	for _, g := range d.guests {
		if g.ID == id {
			return g.Tasks, nil
		}
	}
	return 0, errors.New("no such guest")
}

func counter(v int64) *atomic.Int64 {
	c := &atomic.Int64{}
	c.Store(v)
	return c
}

// TestHostTasksNodeStopSparesTheSession: the node stops (a rolling deploy's restart) while
// the guest that holds the most of the host's total has its processes ended; its count has
// not fallen yet (a runc guest's falls once the agent's kill rounds are done). The node
// gives up on the action: it does not fail the session for a count it did not wait for (its
// next start looks again). Before, the settle's wait ended with the node's context and the
// session was failed, policy_violation, as though its count had stayed.
func TestHostTasksNodeStopSparesTheSession(t *testing.T) {
	const id = "sess_hosttasksstop"
	asked := make(chan struct{}, 1)
	d := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(950), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "g_hosttasksstop", Own: true, Tasks: 900}, {ID: "n2/by", Tasks: 50}}}
	n, _, logs := hostileAgentNode(t, id, Config{Driver: d}, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/procs/end" {
			asked <- struct{}{}
			<-r.Context().Done() // the agent's kill rounds, until the node goes
			return
		}
		http.NotFound(w, r)
	})
	done := relieveInBackground(n, d)
	within(t, asked, "the hog's agent was not asked to end its processes")
	n.cancel() // the node stops
	within(t, done, "the action did not end with the node")
	l := sessionOf(n, id)
	st, reason, rule := liveState(l)
	if st != session.Running {
		t.Errorf("the node stopped while the hog's processes were being ended: its session is %s (%s, rule %q); want running\n%s", st, reason, rule, logs.String())
	}
}

// TestHostTasksRuleSaysNoMoreThanIsSo: past the deferral, the node takes its own biggest
// guest above the share while a bigger guest of another node (one of an older release, or
// stuck) holds more; the session's rule, which its tenant reads, says what it held and its
// share, and not that it held the most of any guest there, which it did not.
func TestHostTasksRuleSaysNoMoreThanIsSo(t *testing.T) {
	const id = "sess_hosttasksrule"
	d := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(920), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "n2/theirs", Tasks: 500}, {ID: "g_hosttasksrule", Own: true, Tasks: 400}, {ID: "n2/by", Tasks: 20}}}
	n, _, logs := hostileAgentNode(t, id, Config{Driver: d}, endingAgent(nil))
	l := sessionOf(n, id)
	n.relieveHostTasks(d, d.cur.Load(), d.limit, false)
	st, reason, rule := liveState(l)
	if st != session.Stopping && st != session.Failed || reason != session.PolicyViolation || !strings.HasPrefix(rule, HostTasksRule+": ") {
		t.Fatalf("the session is %s (%s, rule %q); want stopping or failed, policy_violation, rule %s: …\n%s", st, reason, rule, HostTasksRule, logs.String())
	}
	if strings.Contains(rule, "the most of any guest") || !strings.Contains(rule, "held 400 of the 1000") || !strings.Contains(rule, "share of 333") {
		t.Errorf("the rule: %q; want it to say 400 of 1000 and the share of 333, and not that it held the most of any guest there (another held 500)", rule)
	}
	if strings.Contains(logs.String(), "this guest held the most") {
		t.Errorf("the node's log says the guest held the most (another held 500):\n%s", logs.String())
	}
}

// TestHostTasksStopLooksAgainAfterTheLock: the guest's count stayed through the settle, and
// an operation on the session (a snapshot, a policy check) held its lock meanwhile; by the
// time the node has the lock the host's total fell below the mark (other guests ended). The
// session is not failed on counts from before the wait.
func TestHostTasksStopLooksAgainAfterTheLock(t *testing.T) {
	const id = "sess_hosttaskslock"
	d := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(950), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "g_hosttaskslock", Own: true, Tasks: 900}, {ID: "n2/by", Tasks: 50}}}
	var l *live
	locked := make(chan struct{})
	n, _, logs := hostileAgentNode(t, id, Config{Driver: d}, endingAgent(func() {
		l.mu.Lock() // an operation takes the session's lock, and holds it past the settle
		close(locked)
	}))
	l = sessionOf(n, id)
	done := relieveInBackground(n, d)
	within(t, locked, "the hog's agent was not asked to end its processes")
	time.Sleep(hostTasksSettle + time.Second) // the settle sees the counts stay
	d.cur.Store(500)                          // other guests ended meanwhile
	l.mu.Unlock()
	within(t, done, "the action did not end")
	st, reason, rule := liveState(l)
	if st != session.Running {
		t.Errorf("the total fell below the mark while the node waited for the session's lock: the session is %s (%s, rule %q); want running\n%s", st, reason, rule, logs.String())
	}
}

// TestHostTasksDeferOutlastsAnAction: a node leaves a bigger guest of another node to that
// node for hostTasksDefer, and that node's action on it (its agent's end, the settle, its
// teardown until its tasks go) takes up to endProcsTimeout + hostTasksSettle +
// hostTasksGone, all the while its tasks still count in the total. A deferral shorter than
// that has this node take its own guest above the share (and fail its session, if a runsc
// sandbox's) while the other node is still removing the guest that held the most.
func TestHostTasksDeferOutlastsAnAction(t *testing.T) {
	if action := endProcsTimeout + hostTasksSettle + hostTasksGone; hostTasksDefer <= action {
		t.Errorf("hostTasksDefer is %v, no longer than another node's action on its guest (up to %v): this node takes its own guest while that one still goes", hostTasksDefer, action)
	}
}

// TestHostTasksBusyHogIsNotPassedOver: the guest of this node that holds the most runs a
// session, but an operation on it holds its lock at the look (a snapshot, an exec's policy
// check, which a tenant's own policy may make slow); past the deferral the node must not
// take the next guest of its own above the share for it: it looks again.
func TestHostTasksBusyHogIsNotPassedOver(t *testing.T) {
	const id = "sess_hosttasksmid"
	d := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(950), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "g_hosttasksmid", Own: true, Tasks: 400}, {ID: "g_hosttaskshog", Own: true, Tasks: 500}, {ID: "n2/by", Tasks: 50}}}
	var asked atomic.Int32
	n, _, logs := hostileAgentNode(t, id, Config{Driver: d}, endingAgent(func() {
		asked.Add(1)
	}))
	hog := &live{g: &guest{SessionID: "sess_hosttaskshog", Project: "proj_hostile", GuestID: "g_hosttaskshog", State: session.Running, Template: "tpl",
		StartedAt: time.Now(), IdleTimeoutS: 600, MaxLifetimeS: 600}}
	n.mu.Lock()
	n.guests[hog.g.SessionID] = hog
	mid := n.guests[id]
	n.mu.Unlock()
	hog.mu.Lock() // an operation on the hog's session
	n.relieveHostTasks(d, d.cur.Load(), d.limit, false)
	hog.mu.Unlock()
	mid.mu.Lock()
	st, reason, rule := mid.g.State, mid.g.Reason, mid.g.Rule
	mid.mu.Unlock()
	if st != session.Running || asked.Load() != 0 {
		t.Errorf("the guest of this node that held the most was busy at the look: the next one's agent was asked %d times to end its processes, and its session is %s (%s, rule %q); want neither\n%s", asked.Load(), st, reason, rule, logs.String())
	}
}

// TestHostTasksDeferralIsEachActions: past the first minute above the mark, a bigger guest of
// another node that went (that node's action on it ended) leaves the next bigger one of
// another node, whose action begins only then, to its node for its own minute: this node
// does not take its own guest above the share meanwhile, failing its session, while the one
// that holds the most is still being removed. Past that minute it does.
func TestHostTasksDeferralIsEachActions(t *testing.T) {
	const id = "sess_hosttasksnext"
	var asked atomic.Int32
	first := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(950), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "n2/first", Tasks: 600}, {ID: "g_hosttasksnext", Own: true, Tasks: 380}, {ID: "n3/by", Tasks: 10}}}
	n, _, logs := hostileAgentNode(t, id, Config{Driver: first}, endingAgent(func() {
		asked.Add(1)
	}))
	l := sessionOf(n, id)
	state := func() string {
		l.mu.Lock()
		defer l.mu.Unlock()
		return fmt.Sprintf("%s (%s, rule %q)", l.g.State, l.g.Reason, l.g.Rule)
	}
	n.relieveHostTasks(first, first.cur.Load(), first.limit, true) // the first minute: left to n2
	// The minute passed; n2's guest went, and n3's, which held less, holds the most now.
	next := first
	next.guests = []hypervisor.GuestTasks{{ID: "n3/next", Tasks: 500}, {ID: "g_hosttasksnext", Own: true, Tasks: 400}, {ID: "n3/by", Tasks: 50}}
	n.relieveHostTasks(next, next.cur.Load(), next.limit, false)
	if st := state(); asked.Load() != 0 || !strings.HasPrefix(st, string(session.Running)+" ") {
		t.Fatalf("a bigger guest of another node went, and the next bigger one's action begins: this node's guest's agent was asked %d times to end its processes, and its session is %s; want neither\n%s", asked.Load(), st, logs.String())
	}
	n.hostTasks.waitFrom = time.Now().Add(-hostTasksDefer - time.Second) // its minute passed too
	n.relieveHostTasks(next, next.cur.Load(), next.limit, false)
	if asked.Load() != 1 {
		t.Errorf("past n3's minute too, this node's guest above the share was not taken: its agent was asked %d times; want once (session %s)\n%s", asked.Load(), state(), logs.String())
	}
}

// TestHostTasksPausedHogStopped: near the host's process total, the guest that holds the most
// above the share is a paused session's (a tenant ratcheted its runsc sandbox's host tasks,
// then paused it: its tasks stay, frozen). Its session is stopped, policy_violation, its rule
// saying it was paused, without asking its agent (frozen, it would not answer); a paused
// guest was passed over, and the node failed the next guest of its own above the share,
// perhaps another tenant's, in its place.
func TestHostTasksPausedHogStopped(t *testing.T) {
	const id = "sess_hosttaskspaused"
	d := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(950), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "g_hosttaskspaused", Own: true, Tasks: 700}, {ID: "n2/by", Tasks: 200}, {ID: "n2/by2", Tasks: 50}}}
	var asked atomic.Int64
	n, _, logs := hostileAgentNode(t, id, Config{Driver: d}, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/procs/end" {
			asked.Add(1)
		}
		http.NotFound(w, r)
	})
	l := sessionOf(n, id)
	l.mu.Lock()
	l.g.State = session.Paused
	l.mu.Unlock()
	n.relieveHostTasks(d, d.cur.Load(), d.limit, true)
	st, reason, rule := liveState(l)
	if st != session.Stopping && st != session.Failed || reason != session.PolicyViolation ||
		!strings.HasPrefix(rule, HostTasksRule+": ") || !strings.Contains(rule, "held 700 of the 1000") || !strings.Contains(rule, "while paused") {
		t.Fatalf("a paused session's guest held the most of the host's total: its session is %s (%s, rule %q); want stopping or failed, policy_violation, its rule saying it held 700 of 1000 while paused\n%s",
			st, reason, rule, logs.String())
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the paused guest's agent was asked %d times to end its processes; want none (frozen, it cannot answer)", n)
	}
}

// refillDriver is a tasksDriver whose guest hog's count is hogTasks: it falls when the test
// says (its agent ended its processes, as a runc guest's count falls with them).
type refillDriver struct {
	tasksDriver
	hog      string
	hogTasks *atomic.Int64
}

func (d refillDriver) GuestsTasks(context.Context) ([]hypervisor.GuestTasks, error) {
	gs := slices.Clone(d.guests)
	for i := range gs {
		if gs[i].ID == d.hog {
			gs[i].Tasks = d.hogTasks.Load()
		}
	}
	return gs, nil
}

func (d refillDriver) GuestTasks(ctx context.Context, id string) (int64, error) {
	if id == d.hog && !d.stopped.Load() {
		return d.hogTasks.Load(), nil
	}
	return d.tasksDriver.GuestTasks(ctx, id)
}

// TestHostTasksRefillerStopped: near the host's total, the guest that holds the most above
// the share has its processes ended and its count falls (a runc guest's), and its tenant
// forks them again before the next look, again and again: a tenant with enough such guests
// would hold the host at the mark for good. After hostTasksRefills ends within
// hostTasksRefillWindow, the next time it is taken its session is stopped, policy_violation,
// its rule saying it took them again, without another end.
func TestHostTasksRefillerStopped(t *testing.T) {
	const id = "sess_hosttasksrefill"
	hogTasks := counter(700)
	d := refillDriver{tasksDriver: tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(950), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "g_hosttasksrefill", Own: true}, {ID: "n2/by", Tasks: 200}, {ID: "n2/by2", Tasks: 50}}},
		hog: "g_hosttasksrefill", hogTasks: hogTasks}
	var asked atomic.Int64
	n, _, logs := hostileAgentNode(t, id, Config{Driver: d}, endingAgent(func() {
		asked.Add(1)
		hogTasks.Store(12) // its processes ended: its count falls
	}))
	l := sessionOf(n, id)
	for i := range hostTasksRefills {
		hogTasks.Store(700) // forked again
		n.relieveHostTasks(d, d.cur.Load(), d.limit, true)
		if st, reason, rule := liveState(l); st != session.Running || asked.Load() != int64(i+1) {
			t.Fatalf("end %d: the hog's agent was asked %d times to end its processes, and its session is %s (%s, rule %q); want %d times, running\n%s",
				i+1, asked.Load(), st, reason, rule, i+1, logs.String())
		}
	}
	hogTasks.Store(700) // and again
	n.relieveHostTasks(d, d.cur.Load(), d.limit, true)
	st, reason, rule := liveState(l)
	if st != session.Stopping && st != session.Failed || reason != session.PolicyViolation ||
		!strings.HasPrefix(rule, HostTasksRule+": ") || !strings.Contains(rule, "held 700 of the 1000") || !strings.Contains(rule, "took them again") {
		t.Fatalf("a guest that took its processes again after %d ends held the most of the host's total: its session is %s (%s, rule %q); want stopping or failed, policy_violation, its rule saying it held 700 of 1000 and took them again\n%s",
			hostTasksRefills, st, reason, rule, logs.String())
	}
	if n := asked.Load(); n != hostTasksRefills {
		t.Errorf("its agent was asked %d times to end its processes; want %d (none after them)", n, hostTasksRefills)
	}
}

// TestHostTasksEndsForgotten: ends older than hostTasksRefillWindow do not count, and a
// guest's old ends are forgotten with it.
func TestHostTasksEndsForgotten(t *testing.T) {
	now := time.Now()
	w := &hostTasksWatch{ended: map[string][]time.Time{
		"a": {now.Add(-hostTasksRefillWindow - time.Minute), now.Add(-time.Minute)},
		"b": {now.Add(-hostTasksRefillWindow - time.Second)},
	}}
	if got := w.endsOf("a", now); len(got) != 1 || !got[0].Equal(now.Add(-time.Minute)) {
		t.Errorf("a's ends within the window: %v; want the one a minute ago", got)
	}
	if _, ok := w.ended["b"]; ok {
		t.Errorf("b's ends, all older than the window, are kept: %v", w.ended["b"])
	}
}

// endingAgent answers an agent's POST /v1/procs/end as having ended 3 processes, after
// onEnd (nil: nothing), and anything else with 404.
func endingAgent(onEnd func()) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/procs/end" {
			http.NotFound(w, r)
			return
		}
		if onEnd != nil {
			onEnd()
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ended":3}` + "\n"))
	}
}

// sessionOf answers the node's live session id.
func sessionOf(n *Node, id string) *live {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.guests[id]
}

// liveState answers the session's state, reason and rule as its node holds them.
func liveState(l *live) (session.State, session.Reason, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.g.State, l.g.Reason, l.g.Rule
}

// relieveInBackground runs the node's action on the host's total (counts of d) in a
// goroutine of its own, and answers a channel closed when it ends.
func relieveInBackground(n *Node, d tasksDriver) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.relieveHostTasks(d, d.cur.Load(), d.limit, false)
	}()
	return done
}

// within waits up to a minute for ch to deliver or close, else fails t with why.
func within[T any](t *testing.T, ch <-chan T, why string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatal(why)
	}
}

// pausingDriver is a tasksDriver that pauses and resumes guests.
type pausingDriver struct{ tasksDriver }

func (pausingDriver) Pause(context.Context, string) error  { return nil }
func (pausingDriver) Resume(context.Context, string) error { return nil }

// frozenAgent signals asked at each POST /v1/procs/end and answers none of them (a frozen
// agent's): each waits for its request's end.
func frozenAgent(asked chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/procs/end" {
			http.NotFound(w, r)
			return
		}
		asked <- struct{}{}
		<-r.Context().Done()
	}
}

// TestHostTasksPausedDuringItsEndStopped: near the host's total, the guest that holds the
// most above the share is taken, and its tenant pauses its session while its agent ends its
// processes. Frozen, the agent answers nothing: the pause cuts the request short, and the
// session is stopped as a paused one is (its tasks, frozen, do not fall), at once. Before, the
// node waited out endProcsTimeout on the frozen agent and the settle, then passed the session
// over as no longer running; only the next look stopped it.
func TestHostTasksPausedDuringItsEndStopped(t *testing.T) {
	const id = "sess_hosttaskspausing"
	d := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(950), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "g_hosttaskspausing", Own: true, Tasks: 700}, {ID: "n2/by", Tasks: 200}, {ID: "n2/by2", Tasks: 50}}}
	asked := make(chan struct{}, 1)
	n, _, logs := hostileAgentNode(t, id, Config{Driver: pausingDriver{d}}, frozenAgent(asked))
	l := sessionOf(n, id)
	done := relieveInBackground(n, d)
	within(t, asked, "the hog's agent was not asked to end its processes")
	t0 := time.Now()
	if err := n.Pause(context.Background(), &session.Session{ID: id}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(endProcsTimeout / 2):
		t.Fatalf("the session was paused while its agent ended its processes; %s later the node still waits on the frozen agent\n%s", time.Since(t0).Round(time.Millisecond), logs.String())
	}
	st, reason, rule := liveState(l)
	if st != session.Stopping && st != session.Failed || reason != session.PolicyViolation ||
		!strings.HasPrefix(rule, HostTasksRule+": ") || !strings.Contains(rule, "held 700 of the 1000") || !strings.Contains(rule, "while paused") {
		t.Fatalf("a session paused while the node had its processes ended, its guest holding the most of the host's total: it is %s (%s, rule %q); want stopping or failed, policy_violation, its rule saying it held 700 of 1000 while paused\n%s",
			st, reason, rule, logs.String())
	}
}

// TestGuestEndCutShortByPause: the guest's sandbox nears its own host process limit and the
// node has its agent end its processes; the tenant pauses the session meanwhile, then resumes
// it, and the sandbox nears its limit again. The agent is asked again at once: the pause cut
// the frozen agent's request short. Before, the first request waited out endProcsTimeout, and
// every report of the sandbox's limit in between found the guest's processes "being ended
// already", while a bomb in the resumed guest went on to the limit, where the sandbox dies.
func TestGuestEndCutShortByPause(t *testing.T) {
	const id = "sess_endpaused"
	d := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(100), limit: 1000}
	asked := make(chan struct{}, 2)
	n, _, logs := hostileAgentNode(t, id, Config{Driver: pausingDriver{d}}, frozenAgent(asked))
	l := sessionOf(n, id)
	nearLimit := func() {
		l.mu.Lock()
		n.endGuestProcs(l, l.g.GuestID, "tasks 600 of 1000")
		l.mu.Unlock()
	}
	nearLimit()
	within(t, asked, "the agent was not asked to end the guest's processes")
	ctx := context.Background()
	if err := n.Pause(ctx, &session.Session{ID: id}); err != nil {
		t.Fatal(err)
	}
	if err := n.Resume(ctx, &session.Session{ID: id}); err != nil {
		t.Fatal(err)
	}
	// The cut request's goroutine lets go of the guest's end once its request returns.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		nearLimit()
		select {
		case <-asked:
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("paused and resumed while its agent was asked to end its processes: asked again 5s later, the agent was not (its first request still waits on the agent it froze)\n%s", logs.String())
		}
	}
}

// onWith is a slog handler that calls fn (once) when a logger is made with an attribute of
// key: a test's way into the moment between two steps of the node that logs nothing between.
type onWith struct {
	slog.Handler
	key  string
	once *sync.Once
	fn   func()
}

func (h onWith) WithAttrs(as []slog.Attr) slog.Handler {
	if slices.ContainsFunc(as, func(a slog.Attr) bool { return a.Key == h.key }) {
		h.once.Do(h.fn)
	}
	return onWith{h.Handler.WithAttrs(as), h.key, h.once, h.fn}
}

func (h onWith) WithGroup(name string) slog.Handler {
	return onWith{h.Handler.WithGroup(name), h.key, h.once, h.fn}
}

// TestHostTasksPausedBeforeItsEndStopped: near the host's total, the guest that holds the
// most above the share is taken while running, and its tenant pauses its session after the
// node's look and before its agent is asked to end its processes (the node's logger for the
// action, made in between, is the test's way in). Frozen, the agent answers nothing: the
// request is given up at once, and the session is stopped as a paused one is. Before, the
// pause, finding no request in flight, cut none short, and the node's request then waited out
// endProcsTimeout on the frozen agent.
func TestHostTasksPausedBeforeItsEndStopped(t *testing.T) {
	const id = "sess_hosttaskspausedbefore"
	d := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(950), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "g_hosttaskspausedbefore", Own: true, Tasks: 700}, {ID: "n2/by", Tasks: 200}, {ID: "n2/by2", Tasks: 50}}}
	logs := &syncbuf.Buffer{}
	var nn atomic.Pointer[Node]
	paused := make(chan error, 1)
	h := onWith{Handler: slog.NewTextHandler(logs, nil), key: "ends", once: &sync.Once{}, fn: func() {
		paused <- nn.Load().Pause(context.Background(), &session.Session{ID: id})
	}}
	asked := make(chan struct{}, 1)
	n, _, _ := hostileAgentNode(t, id, Config{Driver: pausingDriver{d}, Logger: slog.New(h)}, frozenAgent(asked))
	nn.Store(n)
	l := sessionOf(n, id)
	t0 := time.Now()
	done := relieveInBackground(n, d)
	select {
	case <-done:
	case <-time.After(endProcsTimeout / 2):
		t.Fatalf("the session was paused before its agent was asked to end its processes; %s later the node still waits on the frozen agent\n%s", time.Since(t0).Round(time.Millisecond), logs.String())
	}
	select {
	case err := <-paused:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("the session was not paused between the node's look and its request\n%s", logs.String())
	}
	st, reason, rule := liveState(l)
	if st != session.Stopping && st != session.Failed || reason != session.PolicyViolation ||
		!strings.HasPrefix(rule, HostTasksRule+": ") || !strings.Contains(rule, "held 700 of the 1000") || !strings.Contains(rule, "while paused") {
		t.Fatalf("a session paused before the node had its processes ended, its guest holding the most of the host's total: it is %s (%s, rule %q); want stopping or failed, policy_violation, its rule saying it held 700 of 1000 while paused\n%s",
			st, reason, rule, logs.String())
	}
}

// TestHostTasksDirectHogStopped: a direct guest (a tier-1 run's, no agent) that holds the most
// of the host's guests' process total above the share is stopped at once, policy_violation,
// its rule saying its processes cannot be ended; before, the node waited out the settle for a
// count that no agent would lower.
func TestHostTasksDirectHogStopped(t *testing.T) {
	const id = "sess_hosttasksdirect"
	d := tasksDriver{oomDriver: oomDriver{kills: &atomic.Int64{}}, stopped: &atomic.Bool{}, cur: counter(950), limit: 1000,
		guests: []hypervisor.GuestTasks{{ID: "g_hosttasksdirect", Own: true, Tasks: 700}, {ID: "n2/by", Tasks: 200}, {ID: "n2/by2", Tasks: 50}}}
	n, _, logs := hostileAgentNode(t, id, Config{Driver: d}, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a direct guest's agent was asked %s %s", r.Method, r.URL.Path)
	})
	dg, err := agent.NewDirectGuest("/", nil, func() {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dg.Close)
	l := sessionOf(n, id)
	l.mu.Lock()
	l.agent, l.direct = nil, dg
	l.mu.Unlock()
	t0 := time.Now()
	n.relieveHostTasks(d, d.cur.Load(), d.limit, true)
	st, reason, rule := liveState(l)
	if st != session.Stopping && st != session.Failed || reason != session.PolicyViolation || !strings.Contains(rule, "tier-1 run") {
		t.Fatalf("a direct guest held the most of the host's total: its session is %s (%s, rule %q); want stopping or failed, policy_violation, its rule naming the tier-1 run\n%s",
			st, reason, rule, logs.String())
	}
	if el := time.Since(t0); el > hostTasksSettle/2 {
		t.Errorf("the direct guest was stopped %s after the look; want at once (no settle)", el.Round(time.Millisecond))
	}
}
