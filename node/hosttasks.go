package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/session"
)

// The host's guests' process total (hypervisor.HostTasker), shared by every guest of every
// node on the host: when they hold all of it, any guest's next process fails and a runsc
// sandbox dies at its next exec. One tenant's runsc sandboxes fill it on their own: under the
// ptrace platform a sandbox's host tasks never fall (each bomb, ended, leaves it higher: 1,099,
// 1,368, 1,621 after three), and two or three such sandboxes, each allowed 12,416, fill a
// total of 28,672; then other tenants' guests die. So, as the kernel's OOM killer takes the
// biggest, the node reads the total at each tick and, once the guests hold hostTasksMark of
// it, has the guest of its own that holds the most, above a fair share, give way: its agent
// ends its processes (a runc guest's count falls with them); should its count not fall (a
// runsc sandbox's) and the total stay above the mark, the session is stopped, failed with
// policy_violation and a rule that says how many it held.
const (
	// hostTasksMark is the share of the total, in percent, past which the node acts. At 85 % a
	// host of pid_max 32,768 (a total of 28,672) keeps 4,300 tasks for the action's few
	// seconds: more than one sandbox's growth under a bomb in two seconds (at most ~1,800 a
	// second, and its own watch ends the bomb at half its limit), and a runc guest cannot pass
	// its own limit (1,024). Below the 90 % at which a failed start says the guests hold
	// their total (oci's guestsTotalNote), so the note is left to the case this missed.
	hostTasksMark = 85
	// hostTasksLook is the least time between two looks at each guest's count (a directory
	// read per node on the host, a file per guest) while the total stays above the mark.
	hostTasksLook = time.Second
	// hostTasksSettle is how long the count of a guest whose processes were ended is given
	// to fall (a runc guest's killed processes are reaped within milliseconds).
	hostTasksSettle = 3 * time.Second
	// hostTasksDefer is how long a guest of another node that holds more than any of this
	// one's is left to its node: that node sees the same counts and acts on it. Past it (that
	// node is of an older release, or stuck), this node acts on its own biggest above the
	// share too. Longer than that node's action may take (its agent's end, the settle, the
	// teardown until the tasks go: up to 53 s), all the while its guest's tasks still count.
	hostTasksDefer = time.Minute
	// hostTasksGone bounds the wait for a stopped guest's tasks to go before the next look:
	// until then the total still counts them, and another guest would be taken for them.
	hostTasksGone = 30 * time.Second
	// HostTasksRule is the rule of a session stopped as the guest that held the most of the
	// host's process total (policy_violation); the rule's text says how many.
	HostTasksRule = "host_process_share"
	// hostTasksRefills is how many times within hostTasksRefillWindow a guest may have its
	// processes ended for the total, its count falling each time, and be taken again: the
	// next time its session is stopped, without ending them once more. A runc guest's count
	// falls with each end, so a tenant that forks again after each (24 or more runc guests,
	// each at its own limit, fill the total) would otherwise hold the host at the mark for
	// good, every other guest's next process at risk.
	hostTasksRefills = 2
	// hostTasksRefillWindow: see hostTasksRefills.
	hostTasksRefillWindow = 10 * time.Minute
)

// hostTasksWatch is the node's watch of the total. above and last belong to the timers'
// goroutine; busy is set while a look or an action is under way (at most one at a time),
// and logged is that goroutine's alone.
type hostTasksWatch struct {
	busy  atomic.Bool
	above time.Time // when the total was first seen above the mark, in this run of ticks
	last  time.Time // the last look
	// logged is when a look that took no guest was last logged (at most every
	// hostTasksLogEvery while the total stays above the mark).
	logged time.Time
	// waitFrom is when the deferral began again (zero: with above), as a guest of another
	// node above the share went since the last look (that node's action on it ended): the
	// next one's action, by its own node, begins then. aboveShare is the guests of other
	// nodes above the share at the last look. The looks' goroutine's alone; cleared with
	// above.
	waitFrom   time.Time
	aboveShare map[string]bool
	// ended is when each guest had its processes ended for the total and its count fell,
	// within hostTasksRefillWindow (hostTasksRefills). The looks' goroutine's alone; kept
	// below the mark too (a tenant that forks again may dip below it between two ends).
	ended map[string][]time.Time
}

// endsOf answers the times guest had its processes ended for the total within
// hostTasksRefillWindow of now, and forgets older ones (every guest's).
func (w *hostTasksWatch) endsOf(guest string, now time.Time) []time.Time {
	for id, ts := range w.ended {
		ts = slices.DeleteFunc(ts, func(at time.Time) bool { return now.Sub(at) > hostTasksRefillWindow })
		if len(ts) == 0 {
			delete(w.ended, id)
		} else {
			w.ended[id] = ts
		}
	}
	return w.ended[guest]
}

// noteEnd records that guest had its processes ended for the total, and its count fell.
func (w *hostTasksWatch) noteEnd(guest string) {
	if w.ended == nil {
		w.ended = map[string][]time.Time{}
	}
	w.ended[guest] = append(w.ended[guest], time.Now())
}

// hostTasksLogEvery: see hostTasksWatch.logged.
const hostTasksLogEvery = 30 * time.Second

// watchHostTasks reads the guests' total (one read) and, above the mark, starts a look at
// which guest to act on (relieveHostTasks) unless one is under way. On the timers' tick.
func (n *Node) watchHostTasks() {
	ht, ok := n.Driver.(hypervisor.HostTasker)
	w := &n.hostTasks
	if !ok || w.busy.Load() {
		return
	}
	cur, limit, err := ht.GuestsTotal()
	if err != nil || limit <= 0 || cur*100 < limit*hostTasksMark {
		w.above, w.waitFrom, w.aboveShare = time.Time{}, time.Time{}, nil
		return
	}
	now := time.Now() // not n.Now: the bounds are of real time
	if w.above.IsZero() {
		w.above = now
	}
	if now.Sub(w.last) < hostTasksLook {
		return
	}
	w.last = now
	deferOthers := now.Sub(w.above) < hostTasksDefer
	w.busy.Store(true)
	if !n.goBackground(func() {
		defer w.busy.Store(false)
		n.relieveHostTasks(ht, cur, limit, deferOthers)
	}) {
		w.busy.Store(false)
	}
}

// pickHog answers the guest to act on: of the guests on the host (every node's), the one
// that holds the most above the share, the total's limit over the number of guests holding
// tasks (a guest at or below it holds no more than an even split would give it, and is
// never taken). It must be this node's and runnable (a session's, running or paused); a
// bigger guest of another node is left to that node, and a bigger one of this node that runs
// no session (stopping: its tasks go with its teardown) waited for, while deferOthers. No
// guest: why not.
func pickHog(guests []hypervisor.GuestTasks, limit int64, runnable func(id string) bool, deferOthers bool) (hog hypervisor.GuestTasks, share int64, why string) {
	share = limit / int64(max(len(guests), 1))
	guests = slices.Clone(guests)
	slices.SortStableFunc(guests, func(a, b hypervisor.GuestTasks) int { return cmp.Compare(b.Tasks, a.Tasks) })
	for _, g := range guests {
		switch {
		case g.Tasks <= share:
			return hypervisor.GuestTasks{}, share, fmt.Sprintf("no guest of this node that runs a session holds more than the share of %d", share)
		case g.Own && runnable(g.ID):
			return g, share, ""
		case !g.Own && deferOthers:
			return hypervisor.GuestTasks{}, share, fmt.Sprintf("the guest that holds the most (%d, above the share of %d) is another node's (%s): left to it", g.Tasks, share, g.ID)
		case deferOthers:
			return hypervisor.GuestTasks{}, share, fmt.Sprintf("the guest that holds the most (%d, above the share of %d), %s, runs no session now (stopping or warm): waited for", g.Tasks, share, g.ID)
		}
	}
	return hypervisor.GuestTasks{}, share, fmt.Sprintf("no guest of this node that runs a session holds more than the share of %d", share)
}

// hostTasksTimeout bounds a look at the guests' counts.
const hostTasksTimeout = 5 * time.Second

// relieveHostTasks looks at every guest's count and acts on the one pickHog answers.
func (n *Node) relieveHostTasks(ht hypervisor.HostTasker, cur, limit int64, deferOthers bool) {
	w := &n.hostTasks
	ctx, cancel := context.WithTimeout(n.ctx, hostTasksTimeout)
	guests, err := ht.GuestsTasks(ctx)
	cancel()
	if err != nil {
		n.Logger.Warn("node: the host's guests hold nearly their process total, and their counts could not be read", "total", cur, "limit", limit, "err", err)
		return
	}
	// This node's running and paused sessions, by guest; one whose lock is held (an
	// operation on it) is left to the next look. A paused one holds its tasks as it did when
	// it was paused (frozen, not gone): a tenant's sandbox that ratcheted its host tasks up
	// and was paused would otherwise be passed over, and the next guest above the share,
	// perhaps another tenant's, failed in its place.
	type running struct {
		l      *live
		sess   string
		agent  *agent.Client
		paused bool
		direct bool // a direct guest: no agent to end its processes
	}
	mine := map[string]running{}
	busy := false
	for _, l := range n.all() {
		if !l.mu.TryLock() {
			busy = true
			continue
		}
		if (l.g.State == session.Running || l.g.State == session.Paused) && l.g.GuestID != "" {
			mine[l.g.GuestID] = running{l, l.g.SessionID, l.agent, l.g.State == session.Paused, l.direct != nil}
		}
		l.mu.Unlock()
	}
	// The deferral is of each action: past its minute from the start, a guest of another node
	// above the share that went since the last look (that node's action on it ended) has the
	// next bigger one's action begin only now, and it is given its minute too.
	share := limit / int64(max(len(guests), 1))
	gone := false
	for id := range w.aboveShare {
		gone = gone || !slices.ContainsFunc(guests, func(g hypervisor.GuestTasks) bool { return g.ID == id && g.Tasks > share })
	}
	if gone {
		w.waitFrom = time.Now()
	}
	w.aboveShare = map[string]bool{}
	for _, g := range guests {
		if !g.Own && g.Tasks > share {
			w.aboveShare[g.ID] = true
		}
	}
	deferOthers = deferOthers || !w.waitFrom.IsZero() && time.Since(w.waitFrom) < hostTasksDefer
	hog, share, why := pickHog(guests, limit, func(id string) bool { _, ok := mine[id]; return ok }, deferOthers)
	if hog.ID == "" {
		if time.Since(w.logged) >= hostTasksLogEvery {
			w.logged = time.Now()
			n.Logger.Info("node: the host's guests hold nearly their process total; no guest of this node is taken", "total", cur, "limit", limit, "guests", len(guests), "why", why)
		}
		return
	}
	// A guest of this node bigger than hog that is not among the running may be one whose
	// lock was held (its guest id cannot be read then): it may run a session, and is the
	// one to take. The next look sees.
	if busy && slices.ContainsFunc(guests, func(g hypervisor.GuestTasks) bool { _, ok := mine[g.ID]; return g.Own && !ok && g.Tasks > hog.Tasks }) {
		if time.Since(w.logged) >= hostTasksLogEvery {
			w.logged = time.Now()
			n.Logger.Info("node: the host's guests hold nearly their process total; a bigger guest of this node may run a session under an operation now: looked at again", "total", cur, "limit", limit, "guests", len(guests))
		}
		return
	}
	r := mine[hog.ID]
	// Past the deferral a bigger guest may hold more (another node's, or one of this node
	// that runs no session): the tenant's rule says "the most" only where it is so.
	most := !slices.ContainsFunc(guests, func(g hypervisor.GuestTasks) bool { return g.Tasks > hog.Tasks })
	t0 := time.Now()
	// A guest whose processes were ended hostTasksRefills times lately, and that took them
	// again each time, is not given another end.
	ends := len(w.endsOf(hog.ID, t0))
	refilled := !r.paused && ends >= hostTasksRefills
	log := n.Logger.With("session", r.sess, "guest", hog.ID, "tasks", hog.Tasks, "most", most, "share", share, "total", cur, "limit", limit, "guests", len(guests), "paused", r.paused, "ends", ends)

	// Its agent ends its processes, unless the node has it do so already (endGuestProcs), the
	// guest is paused (its agent, frozen, would not answer, and its tasks do not fall), or it
	// took them again after its last ends. noEnd says which of the last two, in the words of
	// the end's error, the session's rule and the node's log; with either the session stops.
	type noEndWhy struct{ err, rule, log string }
	pausedWhy := noEndWhy{
		err:  "the session is paused: its processes cannot be ended",
		rule: "while paused, when its processes cannot be ended; run fewer processes or threads at once, and snapshot a session rather than pause it for long",
		log:  "it is paused, when its processes cannot be ended",
	}
	var noEnd noEndWhy
	switch {
	case r.paused:
		noEnd = pausedWhy
	case r.direct:
		noEnd = noEndWhy{
			err:  "a tier-1 run's guest has no agent: its processes cannot be ended",
			rule: "in a tier-1 run, whose processes cannot be ended; run fewer processes or threads at once",
			log:  "it is a direct guest (a tier-1 run's), whose processes cannot be ended",
		}
	case refilled:
		noEnd.err = fmt.Sprintf("its processes were ended %d times in the last %.0f minutes, and it took them again", ends, hostTasksRefillWindow.Minutes())
		noEnd.rule = fmt.Sprintf("and took them again each time the node had its processes ended (%d times in the last %.0f minutes); run fewer processes or threads at once", ends, hostTasksRefillWindow.Minutes())
		noEnd.log = "it took its processes again after each of its last ends"
	}
	var ended int
	endErr := fmt.Errorf("its processes are being ended already")
	if noEnd.err != "" {
		endErr = errors.New(noEnd.err)
	} else if r.agent != nil {
		if ctx, ok := r.l.ending.begin(n.ctx); ok {
			ended, endErr = r.agent.EndProcs(ctx)
			if r.l.ending.done() {
				// Paused meanwhile (the pause cut the request short, or came after the look
				// and before it, which then was given up at once: frozen, its agent answers
				// nothing): its tasks, frozen, do not fall, and it is stopped as a paused one
				// is.
				r.paused, noEnd, endErr = true, pausedWhy, errors.New(pausedWhy.err)
				log = log.With("paused_during_end", true)
			}
		}
	}
	// Given hostTasksSettle to fall: to the share or below, or the total below the mark (a
	// paused guest's, frozen, does not).
	tasks := hog.Tasks
	for deadline := time.Now().Add(hostTasksSettle); noEnd.err == ""; {
		t, err := ht.GuestTasks(n.ctx, hog.ID)
		if err != nil || t <= 0 {
			n.Metrics.hostTasksAction("gone")
			log.Warn("node: the host's guests neared their process total, and this guest was taken; it ended meanwhile (its session's end, or its sandbox's death)",
				"ended", ended, "end_err", endErr, "err", err, "took", time.Since(t0).Round(time.Millisecond))
			return
		}
		tasks = t
		if c, l, err := ht.GuestsTotal(); err == nil {
			cur, limit = c, l
		}
		if tasks <= share || cur*100 < limit*hostTasksMark {
			w.noteEnd(hog.ID)
			n.Metrics.hostTasksAction("ended")
			log.Warn("node: the host's guests neared their process total, and this guest was taken: its agent ended its processes, and its count fell",
				"ended", ended, "end_err", endErr, "tasks_after", tasks, "total_after", cur, "took", time.Since(t0).Round(time.Millisecond))
			return
		}
		if n.ctx.Err() != nil {
			// The node stops (a restart): its count was not given its time to fall, and a
			// session is not failed for that; the next start looks again.
			log.Info("node: the host's guests neared their process total, and this guest was taken; the node stops before its count could fall: the session is left running",
				"ended", ended, "end_err", endErr, "tasks_after", tasks)
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Its count stays (a runsc sandbox's host tasks do not fall with its processes): the
	// session stops, so that the other guests on the host can go on.
	which := "more than its share"
	if most {
		which = "the most of any guest there and more than its share"
	}
	l := r.l
	l.mu.Lock()
	// In the state it was taken in: one paused since has had no end of its processes, and
	// one resumed since may end them now; the next look sees either.
	want := session.Running
	if r.paused {
		want = session.Paused
	}
	stopped := l.g.GuestID == hog.ID && l.g.State == want
	if stopped {
		// An operation on the session may have held its lock for a while (a snapshot):
		// the counts are read again, and a fall meanwhile spares it.
		if t, err := ht.GuestTasks(n.ctx, hog.ID); err == nil {
			tasks = t
		}
		if c, lim, err := ht.GuestsTotal(); err == nil {
			cur, limit = c, lim
		}
		if tasks <= share || cur*100 < limit*hostTasksMark {
			l.mu.Unlock()
			if noEnd.err == "" {
				w.noteEnd(hog.ID)
			}
			n.Metrics.hostTasksAction("ended")
			log.Warn("node: the host's guests neared their process total, and this guest was taken: its agent ended its processes, and its count or the total fell while an operation on the session held it",
				"ended", ended, "end_err", endErr, "tasks_after", tasks, "total_after", cur, "took", time.Since(t0).Round(time.Millisecond))
			return
		}
	}
	rule := fmt.Sprintf("%s: the session's sandbox held %d of the %d processes the host allows its guests together, %s of %d, %s",
		HostTasksRule, tasks, limit, which, share, cmp.Or(noEnd.rule, "and its count did not fall when the node had its processes ended; run fewer processes or threads at once"))
	if stopped {
		n.end(n.ctx, l, session.Policy, session.PolicyViolation, rule)
	}
	l.mu.Unlock()
	if !stopped {
		n.Metrics.hostTasksAction("gone")
		log.Warn("node: the host's guests neared their process total, and this guest was taken; its session ended, or was paused or resumed, meanwhile", "tasks_after", tasks)
		return
	}
	n.Metrics.hostTasksAction("stopped")
	log.Warn("node: the host's guests neared their process total, and this guest was taken; "+cmp.Or(noEnd.log, "its count did not fall when its processes were ended")+": the session is stopped (policy_violation)",
		"ended", ended, "end_err", endErr, "tasks_after", tasks, "total_after", cur, "rule", rule, "took", time.Since(t0).Round(time.Millisecond))
	// The next look waits for its tasks to go (the teardown's), bounded.
	for deadline := time.Now().Add(hostTasksGone); time.Now().Before(deadline) && n.ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		if t, err := ht.GuestTasks(n.ctx, hog.ID); err != nil || t <= 0 {
			return
		}
	}
}

// hostTasksAction counts an action of the node on the guest that held the most of the
// host's process total, by outcome.
func (m *Metrics) hostTasksAction(outcome string) {
	if m == nil {
		return
	}
	m.hostTasks.WithLabelValues(outcome).Inc()
}
