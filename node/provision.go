package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/hypervisor"
	"wb/quota"
	"wb/session"
	"wb/store"
)

// Provision starts a placed session's guest: a warm one from the pool when one fits, else a
// cold start (or a restore from a snapshot), then probes the agent and reports the session
// running. On failure the session fails with start_failure.
func (n *Node) Provision(ctx context.Context, _ store.NodeInfo, sess *session.Session) error {
	eu := ""
	if sess.EndUserID != nil {
		eu = *sess.EndUserID
	}
	pol := ""
	if sess.PolicyID != nil {
		pol = *sess.PolicyID
	}
	l := &live{g: &guest{SessionID: sess.ID, Project: sess.ProjectID, EndUserID: eu, PolicyID: pol, Tier: sess.Tier, Template: sess.Template,
		Resources: sess.Resources, State: session.Provisioning, IdleTimeoutS: sess.IdleTimeoutS, MaxLifetimeS: sess.MaxLifetimeS}}
	n.mu.Lock()
	if _, dup := n.guests[sess.ID]; dup {
		n.mu.Unlock()
		return nil
	}
	n.guests[sess.ID] = l
	n.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	tier, _ := n.Tiers.Tier(sess.Tier)
	sctx, cancel := context.WithTimeout(ctx, tier.ProvisionDeadline())
	defer cancel()
	if err := n.start(sctx, l, sess); err != nil {
		n.Logger.Error("node: start failed", "session", sess.ID, "err", err)
		n.destroy(context.WithoutCancel(ctx), l)
		l.g.Pending = append(l.g.Pending, pending{Kind: "transition", From: session.Provisioning, To: session.Failed,
			Driver: session.Node, Reason: session.StartFailure, At: n.Now()})
		l.g.State, l.g.Reason = session.Failed, session.StartFailure
		n.save(l)
		n.flush(ctx, l)
		return err
	}
	now := n.Now()
	l.g.State, l.g.StartedAt, l.g.LastActivity, l.g.SampledAt = session.Running, now, now, now
	cold := l.g.Cold
	l.g.Pending = append(l.g.Pending, pending{Kind: "transition", From: session.Provisioning, To: session.Running,
		Driver: session.Node, At: now, Cold: &cold})
	n.save(l)
	n.flush(ctx, l)
	n.watch(l)
	return nil
}

// start boots the guest and waits for its agent. The caller holds l.mu.
func (n *Node) start(ctx context.Context, l *live, sess *session.Session) error {
	tpl, err := n.template(sess.Template)
	if err != nil {
		return err
	}
	switch {
	case sess.RestoreFrom != nil:
		l.g.GuestID, l.g.Cold = sess.ID, true
		spec := n.spec(l.g.GuestID, tpl, sess.Resources)
		if err := n.Driver.Restore(ctx, spec, filepath.Join(n.DataDir, "snapshots", *sess.RestoreFrom)); err != nil {
			return fmt.Errorf("restore %s: %w", *sess.RestoreFrom, err)
		}
	default:
		if id, ok := n.pool.take(tpl.Name, sess.Resources); ok {
			// A warm guest may have died while it waited: check before handing it out.
			hctx, cancel := context.WithTimeout(ctx, time.Second)
			err := n.agentFor(id).Health(hctx)
			cancel()
			if err == nil {
				l.g.GuestID, l.g.Cold = id, false
				break
			}
			n.Logger.Warn("node: warm guest unhealthy; starting cold", "guest", id, "err", err)
			n.destroy(ctx, &live{g: &guest{GuestID: id}})
		}
		l.g.GuestID, l.g.Cold = sess.ID, true
		spec := n.spec(l.g.GuestID, tpl, sess.Resources)
		if err := n.Driver.Create(ctx, spec); err != nil {
			return fmt.Errorf("create guest: %w", err)
		}
		if err := n.Driver.Boot(ctx, spec.ID); err != nil {
			return fmt.Errorf("boot guest: %w", err)
		}
	}
	n.save(l)
	l.agent = n.agentFor(l.g.GuestID)
	if err := waitHealthy(ctx, l.agent); err != nil {
		return fmt.Errorf("health probe: %w", err)
	}
	if st, err := n.Driver.Stats(ctx, l.g.GuestID); err == nil {
		l.g.CPURaw = st.CPUMs // count only what the session uses from here
	}
	return nil
}

// watch follows the guest's events: an OOM kill fails the session with oom.
func (n *Node) watch(l *live) {
	ctx, cancel := context.WithCancel(n.ctx)
	l.cancel = cancel
	watched := l.g.GuestID
	ch, err := n.Driver.Events(ctx, watched)
	if err != nil {
		n.Logger.Error("node: events", "session", l.g.SessionID, "err", err)
		cancel()
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for ev := range ch {
			l.mu.Lock()
			if ctx.Err() != nil || l.g.GuestID != watched {
				l.mu.Unlock() // the guest was replaced (a live snapshot) or torn down on purpose
				continue
			}
			st := l.g.State
			switch {
			case ev.Type == hypervisor.EventOOM && st == session.Running:
				n.Logger.Warn("guest OOM", "session", l.g.SessionID)
				n.end(ctx, l, session.Node, session.OOM, "")
			case ev.Type == hypervisor.EventExit && (st == session.Running || st == session.Paused):
				// The guest died under us. An OOM that took the whole guest is an OOM; anything
				// else is what the seed calls a host failure, which the node reports under the
				// placer's name because it is the first to know.
				if s, err := n.Driver.Stats(ctx, l.g.GuestID); err == nil && s.OOMKills > 0 && st == session.Running {
					n.end(ctx, l, session.Node, session.OOM, "")
				} else {
					n.Logger.Warn("guest exited", "session", l.g.SessionID)
					n.end(ctx, l, session.Placer, session.HostFailure, "")
				}
			}
			l.mu.Unlock()
		}
	}()
}

// destroy removes the guest's container and files. The caller holds l.mu.
func (n *Node) destroy(ctx context.Context, l *live) {
	if l.cancel != nil {
		l.cancel()
	}
	if l.agent != nil {
		l.agent.Close()
	}
	if l.g.GuestID == "" {
		return
	}
	if err := n.Driver.Stop(ctx, l.g.GuestID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		n.Logger.Warn("node: stop guest", "guest", l.g.GuestID, "err", err)
	}
	if err := n.Driver.Delete(ctx, l.g.GuestID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		n.Logger.Warn("node: delete guest", "guest", l.g.GuestID, "err", err)
	}
	_ = removeAll(n.guestDir(l.g.GuestID))
}

func (n *Node) save(l *live) {
	if err := n.journal.save(l.g); err != nil {
		n.Logger.Error("node: journal", "err", err)
	}
}

// flush applies l's pending changes to Redis in order; it stops at the first that cannot be
// applied for want of Redis, and drops the guest once it has ended and Redis knows. The
// caller holds l.mu.
func (n *Node) flush(ctx context.Context, l *live) {
	g := l.g
	for len(g.Pending) > 0 {
		p := g.Pending[0]
		rctx, cancel := n.redis(ctx)
		var err error
		switch p.Kind {
		case "transition":
			_, err = n.Store.Transition(rctx, store.Change{Project: g.Project, ID: g.SessionID, From: p.From, To: p.To,
				Driver: p.Driver, Reason: p.Reason, Rule: p.Rule, ColdStart: p.Cold, At: p.At})
			var ce *store.ConflictError
			var te *session.TransitionError
			if errors.As(err, &ce) || errors.As(err, &te) || errors.Is(err, store.ErrNotFound) {
				// Someone else moved the session (a DELETE, the placer): theirs stands.
				n.Logger.Info("node: transition superseded", "session", g.SessionID, "from", p.From, "to", p.To, "err", err)
				err = nil
			}
		case "warning":
			err = n.Store.MarkWarning(rctx, g.Project, g.SessionID, p.Event, p.At)
		case "usage":
			err = n.Store.Redis().XAdd(rctx, &redis.XAddArgs{Stream: quota.UsageStream(g.Project), Values: p.Usage.Values()}).Err()
		}
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				n.Logger.Warn("node: redis unreachable; will replay", "session", g.SessionID, "pending", len(g.Pending), "err", err)
			}
			n.save(l)
			return
		}
		g.Pending = g.Pending[1:]
	}
	if g.State.Terminal() {
		_ = n.journal.remove(g.SessionID)
		n.mu.Lock()
		delete(n.guests, g.SessionID)
		n.mu.Unlock()
		return
	}
	n.save(l)
}

// replay retries every guest's pending changes.
func (n *Node) replay(ctx context.Context) {
	for _, l := range n.all() {
		if !l.mu.TryLock() {
			continue
		}
		if len(l.g.Pending) > 0 {
			n.flush(ctx, l)
		}
		l.mu.Unlock()
	}
}

// recover loads the journal of a previous run: guests still alive are tracked again, with
// their timers; the dead ones end.
func (n *Node) recover(ctx context.Context) error {
	gs, err := n.journal.load()
	if err != nil {
		return err
	}
	n.reapOrphans(ctx, gs)
	for _, g := range gs {
		if !g.State.Terminal() && n.endedElsewhere(ctx, g) {
			continue
		}
		l := &live{g: g}
		n.mu.Lock()
		n.guests[g.SessionID] = l
		n.mu.Unlock()
		if g.State.Terminal() || g.GuestID == "" {
			continue
		}
		info, err := n.Driver.Info(ctx, g.GuestID)
		if err != nil || info.State == hypervisor.StateStopped {
			n.Logger.Warn("node: guest gone after restart", "session", g.SessionID, "err", err)
			l.mu.Lock()
			if g.State == session.Provisioning || g.State == session.Stopping {
				n.finish(ctx, l)
			} else {
				// The host lost the guest (a reboot): what the placer reports for a dead host.
				// The node reports it under the placer's name because it is the first to know.
				g.Pending = append(g.Pending, pending{Kind: "transition", From: g.State, To: session.Failed,
					Driver: session.Placer, Reason: session.HostFailure, At: n.Now()})
				g.State, g.Reason = session.Failed, session.HostFailure
				n.save(l)
			}
			l.mu.Unlock()
			continue
		}
		l.agent = n.agentFor(g.GuestID)
		if g.State == session.Running || g.State == session.Paused {
			n.watch(l)
		}
		n.Logger.Info("node: guest recovered", "session", g.SessionID, "state", g.State)
	}
	return nil
}

// lister is what drivers that can enumerate their guests offer.
type lister interface {
	List(ctx context.Context) ([]string, error)
}

// reapOrphans destroys guests no journal entry owns: warm-pool guests of a previous run and
// guests whose start was cut short by a crash.
func (n *Node) reapOrphans(ctx context.Context, gs []*guest) {
	ls, ok := n.Driver.(lister)
	if !ok {
		return
	}
	ids, err := ls.List(ctx)
	if err != nil {
		n.Logger.Warn("node: list guests", "err", err)
		return
	}
	owned := map[string]bool{}
	for _, g := range gs {
		owned[g.GuestID] = true
	}
	for _, id := range ids {
		if owned[id] {
			continue
		}
		n.Logger.Info("node: removing orphaned guest", "guest", id)
		_ = n.Driver.Stop(ctx, id)
		_ = n.Driver.Delete(ctx, id)
		_ = removeAll(n.guestDir(id))
	}
}

// endedElsewhere destroys a recovered guest whose session already ended while the node was
// away (the placer declared a host failure, or it was deleted), and says so.
func (n *Node) endedElsewhere(ctx context.Context, g *guest) bool {
	rctx, cancel := n.redis(ctx)
	defer cancel()
	s, err := n.Store.Get(rctx, g.Project, g.SessionID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return false // Redis is away: keep the guest and its timers
	}
	if err == nil && !s.State.Terminal() {
		return false
	}
	n.Logger.Info("node: session ended while the node was away", "session", g.SessionID)
	l := &live{g: g}
	n.destroy(ctx, l)
	_ = n.journal.remove(g.SessionID)
	return true
}
