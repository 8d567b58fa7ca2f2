package node

import (
	"cmp"
	"context"
	"errors"
	"time"

	"wb/hypervisor"
	"wb/quota"
	"wb/session"
)

// timers fires the idle and lifetime warnings and stops, and the pause limit, for every
// guest. They run on the node alone, so a control-plane outage cannot extend them.
func (n *Node) timers(ctx context.Context, now time.Time) {
	for _, l := range n.all() {
		if !l.mu.TryLock() { // an operation is under way; the next tick sees it
			if l.busySince.IsZero() {
				l.busySince = now
			}
			if h := l.holder.Load(); h != nil {
				l.busyWith = *h
			}
			continue
		}
		g := l.g
		if !l.busySince.IsZero() {
			// An operation that holds a guest for seconds holds its timers off as long; said
			// when one of them came due meanwhile (a provision holds a guest that has none).
			if held := now.Sub(l.busySince); held >= busyGuestLog && g.timerDue(now) {
				n.Logger.Warn("node: a guest's timers waited for an operation on it", "session", g.SessionID, "state", g.State,
					"waited", held, "operation", cmp.Or(l.busyWith, "unnamed"))
			}
			l.busySince, l.busyWith = time.Time{}, ""
		}
		switch g.State {
		case session.Running:
			switch {
			case !now.Before(g.expiry()):
				n.end(ctx, l, session.Timer, session.MaxLifetime, "")
			case !now.Before(g.idleDeadline()):
				n.end(ctx, l, session.Timer, session.IdleTimeout, "")
			default:
				n.warnings(ctx, l, now)
			}
		case session.Paused:
			switch {
			case !now.Before(g.expiry()):
				n.end(ctx, l, session.Timer, session.MaxLifetime, "")
			case !now.Before(g.PausedAt.Add(session.PauseMax)):
				n.end(ctx, l, session.Timer, session.IdleTimeout, "")
			}
		}
		l.mu.Unlock()
	}
}

func (n *Node) warnings(ctx context.Context, l *live, now time.Time) {
	g := l.g
	fired := false
	if !g.LifeWarned && !now.Before(g.lifetimeWarning()) {
		g.LifeWarned, fired = true, true
		g.Pending = append(g.Pending, pending{Kind: "warning", Event: session.EventLifetimeWarning, At: now})
	}
	if !g.IdleWarned && !now.Before(g.idleWarning()) {
		g.IdleWarned, fired = true, true
		g.Pending = append(g.Pending, pending{Kind: "warning", Event: session.EventIdleWarning, At: now})
	}
	if fired {
		n.saveLater(l) // landed by the flush, before it sends the warning: not on the timers' loop
		n.flushAsync(l)
	}
}

// busyGuestLog: the timers log a guest whose lock they found held for this long, and a
// journal write that took this long is logged too.
const busyGuestLog = time.Second

// statsTimeout bounds a read of a guest's counters.
const statsTimeout = time.Second

// stats reads a guest's counters, bounded by statsTimeout: the node reads them under the
// guest's lock (the timers skip a guest whose lock is held, and a teardown waits for it) or
// before a provision answers, and a VMM's API can be slow to answer, or never.
func (n *Node) stats(ctx context.Context, guestID string) (hypervisor.Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	return n.Driver.Stats(ctx, guestID)
}

// sample measures the guest since the last sample and queues the interval as a usage record:
// billed time while the state bills session seconds, paused time, CPU from its cgroup and
// memory × time. It runs every flush period and at every state change, so an interval is
// spent in one state. The caller holds l.mu.
func (n *Node) sample(ctx context.Context, l *live) {
	n.sampleWith(l, func(guestID string) (hypervisor.Stats, error) { return n.stats(ctx, guestID) })
}

// withoutCounters is sampleWith's counters for a sample that reads none.
func withoutCounters(string) (hypervisor.Stats, error) { return hypervisor.Stats{}, errNoCounters }

var errNoCounters = errors.New("node: the counters are left to the next sample")

// sampleWith is sample with the guest's counters from counters (the caller may have read
// them before it took l.mu). The caller holds l.mu.
func (n *Node) sampleWith(l *live, counters func(guestID string) (hypervisor.Stats, error)) {
	g := l.g
	now := n.Now()
	if g.SampledAt.IsZero() {
		g.SampledAt = now
		return
	}
	dt := now.Sub(g.SampledAt).Milliseconds()
	if dt <= 0 {
		if g.UncountedMs == 0 || g.GuestID == "" || g.State.Terminal() {
			return
		}
		// Within the millisecond of a sample that left its counters to this one (a stop's
		// final meter, right after the stop): read them all the same.
		dt, now = 0, g.SampledAt
	}
	rec := quota.Record{SessionID: g.SessionID, ProjectID: g.Project, EndUserID: g.EndUserID, Tier: g.Tier,
		SizeClass: g.Resources.SizeClass, MemoryMiB: g.Resources.MemoryMiB, DiskGiB: g.Resources.DiskGiB,
		FromMs: g.SampledAt.UnixMilli(), ToMs: now.UnixMilli(), State: g.State}
	g.SampledAt = now
	switch {
	case g.State.BillsSessionSeconds():
		rec.SessionMs = dt
	case g.State == session.Paused:
		rec.PausedMs = dt
	}
	if g.GuestID != "" && !g.State.Terminal() {
		// A sample without the counters loses nothing: CPURaw stays, so the next sample's
		// delta covers both intervals, and that sample's memory stands for both too.
		if st, err := counters(g.GuestID); err == nil {
			// CPU from the cgroup's counter, as deltas: a warm guest's counter starts before
			// its session does, and a restored guest's starts again at zero.
			delta := st.CPUMs - g.CPURaw
			if delta < 0 {
				delta = st.CPUMs
			}
			g.CPURaw, g.CPUBaseline = st.CPUMs, true
			rec.CPUMs = delta
			rec.MemGiBMs = st.MemoryBytes * (dt + g.UncountedMs) / (1 << 30)
			g.UncountedMs = 0
		} else {
			// Within reason: a guest whose counters stay unreadable for hours is billed its
			// memory from its last hour's.
			g.UncountedMs = min(g.UncountedMs+dt, time.Hour.Milliseconds())
		}
	}
	if l.egress != nil {
		rec.EgressBytes = l.egress.bytes.Swap(0)
	}
	g.BilledMs += rec.SessionMs
	g.CPUMs += rec.CPUMs
	g.MemGiBMs += rec.MemGiBMs
	if mergeUsage(l, rec, now) {
		return
	}
	g.Seq++
	rec.Seq = g.Seq
	g.Pending = append(g.Pending, pending{Kind: "usage", Usage: &rec, At: now})
}

// mergeUsage extends the guest's newest pending change with rec, the interval that follows
// it, when that change is a usage record no flush has offered Redis yet (live.offered) of
// the same state, size and settling hour: while the journal fails the flush holds every
// record back, and without this a guest would hold one more each flush period for as long
// as it lasts. The record keeps its seq (the next is still one more), and its sums are the
// two intervals' sums, so the bill is the same. A record Redis may have is never changed:
// the settler takes each seq once. The caller holds l.mu.
func mergeUsage(l *live, rec quota.Record, now time.Time) bool {
	p := l.g.Pending
	if len(p) == 0 || p[len(p)-1].Usage == nil {
		return false
	}
	u := *p[len(p)-1].Usage
	if u.Seq <= l.offered || u.ToMs != rec.FromMs || hourOf(u.ToMs) != hourOf(rec.ToMs) ||
		u.SessionID != rec.SessionID || u.ProjectID != rec.ProjectID || u.EndUserID != rec.EndUserID ||
		u.Tier != rec.Tier || u.SizeClass != rec.SizeClass || u.MemoryMiB != rec.MemoryMiB ||
		u.DiskGiB != rec.DiskGiB || u.State != rec.State {
		return false
	}
	u.ToMs = rec.ToMs
	u.SessionMs += rec.SessionMs
	u.PausedMs += rec.PausedMs
	u.CPUMs += rec.CPUMs
	u.MemGiBMs += rec.MemGiBMs
	u.EgressBytes += rec.EgressBytes
	// A new record, not the old one changed: a flush may hold the old one's pointer.
	p[len(p)-1] = pending{Kind: "usage", Usage: &u, At: now}
	return true
}

// hourOf is the hour the settler counts a record ending at ms in (quota: its ToMs's).
func hourOf(ms int64) int64 { return ms / time.Hour.Milliseconds() }

// flushUsage samples every running or paused guest and sends its records.
func (n *Node) flushUsage(ctx context.Context) {
	for _, l := range n.all() {
		if !l.mu.TryLock() {
			continue
		}
		st, guestID, sampledAt := l.g.State, l.g.GuestID, l.g.SampledAt
		l.mu.Unlock()
		if st != session.Running && st != session.Paused {
			continue
		}
		// The counters are read before the lock is taken again: on a loaded host a read took
		// up to 2 s, and the timers skip a guest whose lock is held (its idle warning came
		// seconds late). They are used only if no other sample came in between (its newer
		// counter would make this one's delta negative) and the guest is the same one.
		stats, statsErr := n.stats(ctx, guestID)
		l.mu.Lock()
		if l.g.State != st {
			l.mu.Unlock()
			continue // a state change sampled it
		}
		if l.g.GuestID != guestID || !l.g.SampledAt.Equal(sampledAt) {
			statsErr = errors.New("the guest was sampled or replaced since its counters were read")
		}
		n.sampleWith(l, func(string) (hypervisor.Stats, error) { return stats, statsErr })
		write := n.saveLater(l)
		var sample *session.GuestEvent
		if p := l.g.Pending; st == session.Running && len(p) > 0 && p[len(p)-1].Usage != nil {
			u := p[len(p)-1].Usage
			sample = &session.GuestEvent{Type: session.GuestResourceSample, CPUMs: u.CPUMs, IntervalMs: u.ToMs - u.FromMs,
				MemoryBytes: u.MemGiBMs * (1 << 30) / max(1, u.ToMs-u.FromMs)}
		}
		l.mu.Unlock()
		write() // unlocked, and before the flush sends Redis the sample it holds
		n.flush(ctx, l)
		if sample != nil {
			n.checkEvent(ctx, l, *sample)
			n.checkProcesses(ctx, l)
		}
	}
}
