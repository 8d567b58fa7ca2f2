package node

import (
	"context"
	"time"

	"wb/session"
)

// timers fires the idle and lifetime warnings and stops, and the pause limit, for every
// guest. They run on the node alone, so a control-plane outage cannot extend them.
func (n *Node) timers(ctx context.Context, now time.Time) {
	for _, l := range n.all() {
		if !l.mu.TryLock() { // an operation is under way; the next tick sees it
			continue
		}
		g := l.g
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
		n.save(l)
		n.flush(ctx, l)
	}
}

// sample adds the time since the last sample to the guest's usage: billed time while the
// state bills session seconds, memory × time, and CPU from its cgroup. The caller holds l.mu.
func (n *Node) sample(ctx context.Context, l *live) {
	g := l.g
	now := n.Now()
	if g.SampledAt.IsZero() {
		g.SampledAt = now
		return
	}
	dt := now.Sub(g.SampledAt).Milliseconds()
	if dt <= 0 {
		return
	}
	g.SampledAt = now
	if g.State.BillsSessionSeconds() {
		g.BilledMs += dt
	}
	if g.GuestID == "" || g.State.Terminal() {
		return
	}
	st, err := n.Driver.Stats(ctx, g.GuestID)
	if err != nil {
		return
	}
	// CPU from the cgroup's counter, as deltas: a warm guest's counter starts before its
	// session does, and a restored guest's starts again at zero.
	delta := st.CPUMs - g.CPURaw
	if delta < 0 {
		delta = st.CPUMs
	}
	g.CPUMs, g.CPURaw = g.CPUMs+delta, st.CPUMs
	g.MemGiBMs += st.MemoryBytes * dt / (1 << 30)
}

// flushUsage samples every guest and writes its usage_to_date.
func (n *Node) flushUsage(ctx context.Context) {
	for _, l := range n.all() {
		if !l.mu.TryLock() {
			continue
		}
		if !l.g.State.Terminal() && l.g.State != session.Provisioning {
			n.sample(ctx, l)
			n.save(l)
			n.flushUsageOf(ctx, l)
		}
		l.mu.Unlock()
	}
}

// flushUsageOf writes one guest's usage to Redis, best effort. The caller holds l.mu.
func (n *Node) flushUsageOf(ctx context.Context, l *live) {
	rctx, cancel := n.redis(ctx)
	defer cancel()
	if err := n.Store.SetUsage(rctx, l.g.Project, l.g.SessionID, l.g.usage()); err != nil && ctx.Err() == nil {
		n.Logger.Debug("node: usage flush", "session", l.g.SessionID, "err", err)
	}
}
