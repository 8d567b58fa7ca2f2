package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/session"
	"wb/store"
)

// Provision starts a placed session's guest: a warm one from the pool when one fits, else a
// cold start (or a restore from a snapshot), then probes the agent and reports the session
// running. On failure the session fails with start_failure.
func (n *Node) Provision(ctx context.Context, _ store.NodeInfo, sess *session.Session) error {
	if err := n.waitRecovered(ctx); err != nil {
		return err
	}
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
	t0 := time.Now()
	l.mu.Lock()
	tier, _ := n.Tiers.Tier(sess.Tier)
	sctx, cancel := context.WithTimeout(ctx, tier.ProvisionDeadline())
	defer cancel()
	// The outcome reaches Redis before Provision returns (flush runs unlocked).
	if err := n.start(sctx, l, sess); err != nil {
		n.Logger.Error("node: start failed", "session", sess.ID, "err", err)
		n.destroy(context.WithoutCancel(ctx), l)
		l.g.Pending = append(l.g.Pending, pending{Kind: "transition", From: session.Provisioning, To: session.Failed,
			Driver: session.Node, Reason: session.StartFailure, At: n.Now()})
		l.g.State, l.g.Reason = session.Failed, session.StartFailure
		n.save(l)
		l.mu.Unlock()
		n.flush(ctx, l)
		n.pool.kick()
		return err
	}
	now := n.Now()
	l.g.State, l.g.StartedAt, l.g.LastActivity, l.g.SampledAt = session.Running, now, now, now
	// As a touch's write does (see touch): the session's first activity, a run's exec within
	// milliseconds of the start, then writes no entry of its own.
	l.g.ActivityUntil = now.Add(activitySaved)
	cold := l.g.Cold
	l.g.Pending = append(l.g.Pending, pending{Kind: "transition", From: session.Provisioning, To: session.Running,
		Driver: session.Node, At: now, Cold: &cold})
	n.save(l)
	n.startEgress(l)
	guestID := l.g.GuestID // under l.mu: a memory snapshot may replace the guest once it runs
	l.mu.Unlock()
	n.flush(ctx, l)
	// A claimed warm guest is replaced now that the session is reported running, not while
	// its claim wanted the CPU (see warmPool.take).
	n.pool.kick()
	n.Logger.Debug("node: provisioned", "session", sess.ID, "cold", cold, "took", time.Since(t0))
	// The CPU baseline (a warm guest's counter started before its session) is read once the
	// session is reported running: on runsc it can take a runtime call.
	// So is the event watch (its first look at the guest runs the runtime on runsc).
	// A sample taken meanwhile has its own reading, newer or not, and a replaced guest a
	// counter of its own: either way this one is not the baseline.
	st, err := n.stats(ctx, guestID)
	l.mu.Lock()
	if err == nil && !l.g.CPUBaseline && l.g.GuestID == guestID {
		l.g.CPURaw, l.g.CPUBaseline = st.CPUMs, true
	}
	var wctx context.Context
	watched := ""
	if l.g.State == session.Running {
		wctx, watched = n.beginWatch(l)
	}
	l.mu.Unlock()
	// The watch's first look runs the runtime (runc state, a process): not under l.mu, where
	// the session's first exec (a run's only one) would wait for it.
	if watched != "" {
		n.startWatch(wctx, l, watched)
	}
	return nil
}

// warmProbeTimeout bounds the health probe of a claimed warm guest.
const warmProbeTimeout = 5 * time.Second

// warmAlive checks that claimed warm guest id still runs. Where the driver knows (a
// container, whose agent is its init), that is a look at the host's process table: a
// round trip into a gVisor guest costs 3–20 ms on these hosts, most of a warm claim, and
// the pool's boot already had the agent answer. What that gives up is catching an agent
// that hangs while its process lives; the session's first call would time out instead.
// Elsewhere the agent is probed, over the client the session keeps (the one the pool's
// boot opened); a live guest on a loaded host may take seconds to answer, still far less
// than a cold start (a 1 s bound sent runs cold under load).
func (n *Node) warmAlive(ctx context.Context, id string, c *agent.Client) error {
	if running, known := n.Driver.KnownRunning(id); known {
		if !running {
			return errors.New("its process is gone")
		}
		return nil
	}
	hctx, cancel := context.WithTimeout(ctx, warmProbeTimeout)
	defer cancel()
	return c.Health(hctx)
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
		dir, release, err := n.restoreDir(ctx, *sess.RestoreFrom)
		if err != nil {
			return fmt.Errorf("restore_from: %w", err)
		}
		err = n.Driver.Restore(ctx, spec, dir)
		release()
		if err != nil {
			return fmt.Errorf("restore %s: %w", *sess.RestoreFrom, err)
		}
		// A memory snapshot's agent was quiesced until its resume file appears; the driver
		// has mounted the new guest's agent dir by now. (A disk-only restore boots an agent
		// that never looks for the file; one reached through the driver was never quiesced.)
		if _, viaDriver := n.Driver.(hypervisor.AgentDialer); !viaDriver {
			if err := n.resumeAgent(l.g.GuestID, resumeFile(*sess.RestoreFrom)); err != nil {
				return fmt.Errorf("restore %s: %w", *sess.RestoreFrom, err)
			}
		}
	default:
		if w, ok := n.pool.take(ctx, tpl.Name, sess.Resources, sess.Metadata[session.RunMetadataKey]); ok {
			// A warm guest may have died while it waited (see warmAlive).
			id, c := w.id, w.agent
			var err error
			if w.direct != nil {
				err = n.directAlive(id, w.direct)
			} else {
				err = n.warmAlive(ctx, id, c)
			}
			if err == nil {
				l.g.GuestID, l.g.Cold, l.agent, l.direct = id, false, c, w.direct
				break
			}
			w.close()
			n.Logger.Warn("node: warm guest unhealthy; starting cold", "guest", id, "err", err)
			n.destroy(ctx, &live{g: &guest{GuestID: id}})
		}
		l.g.GuestID, l.g.Cold = sess.ID, true
		if err := n.launch(ctx, n.spec(l.g.GuestID, tpl, sess.Resources)); err != nil {
			return err
		}
	}
	n.save(l)
	if l.agent == nil && l.direct == nil { // a cold start or a restore: probe until the agent answers
		l.agent = n.agentFor(l.g.GuestID)
		if err := waitHealthy(ctx, l.agent); err != nil {
			return fmt.Errorf("health probe: %w", err)
		}
	}
	return nil
}

// launch creates and boots a guest, in one step where the driver can (hypervisor.Launcher).
func (n *Node) launch(ctx context.Context, spec hypervisor.Spec) error {
	if l, ok := n.Driver.(hypervisor.Launcher); ok {
		if err := l.Launch(ctx, spec); err != nil {
			return fmt.Errorf("launch guest: %w", err)
		}
		return nil
	}
	if err := n.Driver.Create(ctx, spec); err != nil {
		return fmt.Errorf("create guest: %w", err)
	}
	if err := n.Driver.Boot(ctx, spec.ID); err != nil {
		return fmt.Errorf("boot guest: %w", err)
	}
	return nil
}

// watch follows the guest's events: an OOM kill fails the session with oom, a guest that
// dies of anything else while running fails it with guest_crash, and a sandbox near its host
// process limit has its guest's processes ended (endGuestProcs).
func (n *Node) watch(l *live) {
	ctx, watched := n.beginWatch(l)
	n.startWatch(ctx, l, watched)
}

// beginWatch makes the watch's context, which kill cancels, and answers it with the guest it
// watches. The caller holds l.mu.
func (n *Node) beginWatch(l *live) (context.Context, string) {
	ctx, cancel := context.WithCancel(n.ctx)
	l.cancel = cancel
	return ctx, l.g.GuestID
}

// startWatch starts following guest watched's events until ctx ends; the caller may hold l.mu
// or not.
func (n *Node) startWatch(ctx context.Context, l *live, watched string) {
	ch, err := n.Driver.Events(ctx, watched)
	if err != nil {
		if ctx.Err() == nil {
			n.Logger.Error("node: events", "guest", watched, "err", err)
		}
		return
	}
	// When the node winds down, ctx has ended with it, and the driver closes ch.
	n.goBackground(func() {
		for ev := range ch {
			l.mu.Lock()
			if ctx.Err() != nil || l.g.GuestID != watched {
				l.mu.Unlock() // the guest was replaced (a live snapshot) or torn down on purpose
				continue
			}
			st := l.g.State
			switch {
			case ev.Type == hypervisor.EventPids && st == session.Running:
				n.endGuestProcs(l, watched, ev.Detail)
			case ev.Type == hypervisor.EventOOM && st == session.Running:
				n.Logger.Warn("guest OOM", "session", l.g.SessionID)
				n.end(n.ctx, l, session.Node, session.OOM, "")
			case ev.Type == hypervisor.EventExit && st == session.Running && l.direct != nil && l.direct.Used() && !n.oomKilled(ctx, l):
				// A direct guest's init ends with its one exec: that is no crash. Its run's
				// end stops the session.
			case ev.Type == hypervisor.EventExit && (st == session.Running || st == session.Paused):
				// The guest died under us while this host works (the node is here to see it).
				// An OOM that took the whole guest is an OOM; a running guest that died
				// otherwise did so by its own doing (its sandbox gave out under what it ran):
				// guest_crash, never host_failure, which is for hosts. A paused guest runs
				// nothing that could kill it, so its death is the host's, reported under the
				// placer's name because the node is the first to know.
				s, serr := n.stats(ctx, l.g.GuestID)
				switch {
				case st == session.Running && serr == nil && s.OOMKills > 0:
					n.end(n.ctx, l, session.Node, session.OOM, "")
				case st == session.Running:
					n.Logger.Warn("guest crashed", "session", l.g.SessionID, "stats", s, "stats_err", serr, "detail", ev.Detail)
					n.end(n.ctx, l, session.Node, session.GuestCrash, "")
				default:
					n.Logger.Warn("paused guest exited", "session", l.g.SessionID, "detail", ev.Detail)
					n.end(n.ctx, l, session.Placer, session.HostFailure, "")
				}
			}
			l.mu.Unlock()
		}
	})
}

// destroy kills the guest and removes its container and files. The caller holds l.mu.
func (n *Node) destroy(ctx context.Context, l *live) {
	n.kill(ctx, l)
	n.remove(ctx, l.g.GuestID)
}

// kill stops watching the guest and kills it; it leaves the container to remove. The caller
// holds l.mu. It runs on its own context: a kill must not be cut short with the watcher's.
func (n *Node) kill(ctx context.Context, l *live) {
	ctx = context.WithoutCancel(ctx)
	if l.cancel != nil {
		l.cancel()
	}
	l.stopEgress()
	if l.agent != nil {
		l.agent.Close()
	}
	if l.direct != nil {
		l.direct.Close()
	}
	if l.g.GuestID == "" {
		return
	}
	if err := n.Driver.Stop(ctx, l.g.GuestID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		n.Logger.Warn("node: stop guest", "guest", l.g.GuestID, "err", err)
	}
}

// remove deletes a stopped guest's container and files (slow on runsc: call it unlocked).
func (n *Node) remove(ctx context.Context, guestID string) {
	if guestID == "" {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if err := n.Driver.Delete(ctx, guestID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		n.Logger.Warn("node: delete guest", "guest", guestID, "err", err)
	}
	_ = removeAll(n.guestDir(guestID))
}

func (n *Node) save(l *live) { n.saveLater(l)() }

// guestOp is an operation's hold on a guest's lock, with the journal write it took under
// it (saveLater, touch): unlock lets go of the lock first and then writes, before the
// operation answers.
type guestOp struct {
	l    *live
	land func()
}

// lockFor takes l.mu for the operation named what (the timers' log names it should they
// wait for it); defer its unlock.
func lockFor(l *live, what string) *guestOp {
	l.mu.Lock()
	l.holder.Store(&what)
	return &guestOp{l: l, land: func() {}}
}

func (op *guestOp) unlock() {
	op.l.holder.Store(nil)
	op.l.mu.Unlock()
	op.land()
}

// saveLater takes the guest's journal entry as it is now (the caller holds l.mu) and answers
// its write, for the caller to make once it has let go of l.mu: on a saturated disk journal
// writes took seconds, and the timers skip a guest whose lock is held. The write lands the
// newest entry taken, unless one as new has landed or the entry was removed since
// (forgetJournal).
//
// The journal is written ahead: a flush sends Redis a guest's pending changes only once an
// entry that holds them has landed (landJournal), so Redis never holds a usage record the
// journal lacks, whose sequence number a restarted node would give to another interval (the
// settler takes each number once).
func (n *Node) saveLater(l *live) func() {
	l.jseq++
	seq, id := l.jseq, l.g.SessionID
	b, err := json.Marshal(l.g)
	if err != nil {
		n.Logger.Error("node: journal", "session", id, "err", err)
		return func() {}
	}
	l.jq.Lock()
	if seq > l.jnext.seq {
		l.jnext = journalEntry{seq: seq, id: id, b: b}
	}
	l.jq.Unlock()
	// An operation answers whether or not its entry landed (landJournal logs a failure): the
	// flush holds back from Redis whatever the journal lacks.
	return func() { _ = n.landJournal(l, seq) }
}

// journalEntry is a guest's journal entry taken, numbered, to be written.
type journalEntry struct {
	seq uint64
	id  string
	b   []byte
}

// landJournal makes sure an entry numbered seq or newer has landed, writing the newest taken
// if none has, and answers the write's error if it did not land. It does not need l.mu, and
// must not be called with it held but by save.
func (n *Node) landJournal(l *live, seq uint64) error {
	l.jmu.Lock()
	defer l.jmu.Unlock()
	if l.jwritten >= seq {
		return nil
	}
	l.jq.Lock()
	e := l.jnext
	l.jq.Unlock()
	if e.seq <= l.jwritten {
		return nil
	}
	start := time.Now()
	if err := n.journal.put(e.id, e.b); err != nil {
		// Once a streak: every flush of every guest retries, and fails alike (a full disk).
		if !n.journalFailing.Swap(true) {
			n.Logger.Error("node: the journal does not write; guests' changes wait for it, Redis gets none of them",
				"session", e.id, "err", err)
		}
		return err
	}
	if n.journalFailing.CompareAndSwap(true, false) {
		n.Logger.Info("node: the journal writes again; the changes held back go to Redis", "session", e.id)
	}
	l.jwritten = e.seq
	if took := time.Since(start); took >= busyGuestLog {
		n.Logger.Warn("node: a journal write was slow (the disk is busy)", "session", e.id, "took", took)
	}
	return nil
}

// forgetJournal removes session id's journal entry (l's); no entry taken before lands after.
func (n *Node) forgetJournal(l *live, id string) {
	l.jmu.Lock()
	defer l.jmu.Unlock()
	l.jwritten = math.MaxUint64
	if err := n.journal.remove(id); err != nil {
		n.Logger.Warn("node: journal", "session", id, "err", err)
	}
}

// flushAsync flushes l's pending changes in the background.
func (n *Node) flushAsync(l *live) {
	n.goBackground(func() { n.flush(n.ctx, l) })
}

// flush applies l's pending changes to Redis in order, without holding l.mu while it waits
// on Redis (so timers never wait for it). It stops at the first change Redis does not take
// for want of an answer (replay retries it), and forgets the guest once it has ended and
// Redis knows. It answers whether everything was applied.
func (n *Node) flush(ctx context.Context, l *live) bool {
	l.fl.Lock()
	defer l.fl.Unlock()
	l.mu.Lock()
	todo := append([]pending(nil), l.g.Pending...)
	project, id, seq := l.g.Project, l.g.SessionID, l.jseq
	// From here the records taken may reach Redis, and no sample may extend them; until the
	// journal has landed they cannot, and that is undone if it does not.
	offered := l.offered
	for _, p := range todo {
		if p.Usage != nil {
			l.offered = max(l.offered, p.Usage.Seq)
		}
	}
	l.mu.Unlock()
	if err := n.landJournal(l, seq); err != nil && len(todo) > 0 {
		// Written ahead (see saveLater): Redis gets nothing the journal lacks. The changes
		// stay pending; the next flush (the usage flush's, a replay's) writes the entry first.
		// Meanwhile the samples extend the newest record held, rather than add one every
		// flush period (mergeUsage).
		l.mu.Lock()
		l.offered = offered
		l.mu.Unlock()
		return false
	}
	done := 0
	var failed error
	for _, p := range todo {
		if failed = n.apply(ctx, project, id, p); failed != nil {
			break
		}
		done++
	}
	awaits := errors.Is(failed, errAwaitsSnapshot)
	if len(todo) > 0 {
		n.redisDown.Store(failed != nil && !awaits)
	}
	l.mu.Lock()
	// Only the changes tried may be in Redis; those after the one that failed were not, and
	// the samples may extend their newest again: a guest holds two records through an
	// outage of Redis, the one retried and the one growing.
	l.offered = offered
	for _, p := range todo[:min(done+1, len(todo))] {
		if p.Usage != nil {
			l.offered = max(l.offered, p.Usage.Seq)
		}
	}
	g := l.g
	g.Pending = g.Pending[done:]
	if failed != nil && !awaits && ctx.Err() == nil && !n.warned(l) {
		n.Logger.Warn("node: redis unreachable; will replay", "session", id, "pending", len(g.Pending), "err", failed)
	}
	if failed == nil && l.warned {
		// The outage's one warning has its end, whichever flush got through: without it, a
		// replay that makes no progress and one that is done look the same in the log.
		n.Logger.Info("node: redis answers again; replayed what it missed", "session", id, "replayed", done)
		l.warned = false
	}
	if g.State.Terminal() && len(g.Pending) == 0 {
		n.forgetJournal(l, id)
		n.mu.Lock()
		if n.guests[id] == l {
			delete(n.guests, id)
			n.releaseClaimOf(l)
		}
		n.mu.Unlock()
		l.mu.Unlock()
		return true
	}
	if done == 0 {
		// Nothing applied, so nothing to write: the journal holds these changes already
		// (landed above). During an outage each replay round's probe rewrote the entry.
		l.mu.Unlock()
		return failed == nil
	}
	// Written unlocked: an entry that does not land before a crash still holds the changes
	// Redis took, which replay again harmlessly (a transition Redis has is superseded, a
	// usage record's sequence number is settled once).
	write := n.saveLater(l)
	l.mu.Unlock()
	write()
	return failed == nil
}

// warned rate-limits the outage warning to once per guest and outage.
func (n *Node) warned(l *live) bool {
	was := l.warned
	l.warned = true
	return was
}

// errAwaitsSnapshot is a transition from running that Redis refused while the session is
// snapshotting: the snapshot's caller returns it to running once the node has answered, and
// the guest may end before that (its restore failed after a memory snapshot, whose upload to
// an object store may take minutes). The change stays pending, for replay, rather than being
// dropped as superseded.
var errAwaitsSnapshot = errors.New("node: the session is snapshotting; the transition waits for it to run again")

// apply writes one pending change to Redis.
func (n *Node) apply(ctx context.Context, project, id string, p pending) error {
	rctx, cancel := n.redis(ctx)
	defer cancel()
	switch p.Kind {
	case "transition":
		_, err := n.Store.Transition(rctx, store.Change{Project: project, ID: id, From: p.From, To: p.To,
			Driver: p.Driver, Reason: p.Reason, Rule: p.Rule, ColdStart: p.Cold, At: p.At})
		var ce *store.ConflictError
		if errors.As(err, &ce) && ce.Current == session.Snapshotting && p.From == session.Running {
			return errAwaitsSnapshot
		}
		var te *session.TransitionError
		if errors.As(err, &ce) || errors.As(err, &te) || errors.Is(err, store.ErrNotFound) {
			// Someone else moved the session (a DELETE, the placer): theirs stands.
			n.Logger.Info("node: transition superseded", "session", id, "from", p.From, "to", p.To, "err", err)
			return nil
		}
		return err
	case "warning":
		return n.Store.MarkWarning(rctx, project, id, p.Event, p.At)
	case "rearm":
		return n.Store.ClearIdleWarning(rctx, project, id)
	case "usage":
		return n.Store.AppendUsage(rctx, project, p.Usage.Values())
	}
	return nil
}

// replay retries every guest's pending changes; while Redis is down it probes with one
// guest a round instead of waiting on each, and so while the journal does not write (a round
// each Tick would rewrite every guest's entry, which grows with its pending usage).
func (n *Node) replay(ctx context.Context) {
	for _, l := range n.all() {
		l.mu.Lock()
		has := len(l.g.Pending) > 0
		l.mu.Unlock()
		if !has {
			continue
		}
		if !n.flush(ctx, l) && (n.redisDown.Load() || n.journalFailing.Load()) {
			return
		}
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
	// The guests of the sessions recovered here, before any goroutine of theirs starts; gone
	// ones leave it below.
	held := map[string]bool{}
	for _, g := range gs {
		if g.GuestID != "" && !g.State.Terminal() {
			held[g.GuestID] = true
		}
	}
	defer n.reapGuestDirs(ctx, held)
	for _, g := range gs {
		if !g.State.Terminal() && n.endedElsewhere(ctx, g) {
			continue
		}
		if g.ActivityUntil.After(g.LastActivity) {
			g.LastActivity = g.ActivityUntil // activity the journal did not learn of (see touch)
		}
		l := &live{g: g, offered: g.Seq} // a previous run may have sent them all
		n.mu.Lock()
		n.guests[g.SessionID] = l
		n.mu.Unlock()
		if g.State.Terminal() || g.GuestID == "" {
			continue
		}
		info, err := n.Driver.Info(ctx, g.GuestID)
		if err != nil || info.State == hypervisor.StateStopped {
			n.Logger.Warn("node: guest gone after restart", "session", g.SessionID, "err", err)
			delete(held, g.GuestID)
			l.mu.Lock()
			switch g.State {
			case session.Stopping:
				g.Pending = append(g.Pending, pending{Kind: "transition", From: session.Stopping, To: g.Reason.Terminal(),
					Driver: session.Node, Reason: g.Reason, Rule: g.Rule, At: n.Now()})
				g.State = g.Reason.Terminal()
				n.save(l)
			case session.Provisioning:
				g.Pending = append(g.Pending, pending{Kind: "transition", From: session.Provisioning, To: session.Failed,
					Driver: session.Node, Reason: session.StartFailure, At: n.Now()})
				g.State, g.Reason = session.Failed, session.StartFailure
				n.save(l)
			default:
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
		switch g.State {
		case session.Running, session.Paused:
			l.mu.Lock()
			n.watch(l)
			n.startEgress(l)
			l.mu.Unlock()
		case session.Stopping:
			// Its stop was under way when the node went (a stop saving the guest checkpoints
			// it first, seconds at most; a node winding down starts no teardown): finish it,
			// since nothing else will (the control plane sees the session stopping already).
			n.teardownAsync(l)
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

// reapGuestDirs removes the dirs under DataDir/guests of guests that are gone: a recovered
// session's guest destroyed while no node ran (a host's reboot; the run dir's guests that a
// node on the disk layout reaps, see oci.OpenDataDir), or one whose session an earlier run's
// journal let go of. A guest's dir goes with its delete by the node, and these were not
// deleted by one: nothing else removes them, disk image and all. A dir stays while the
// driver lists its guest, a session here holds it (held), or anything is mounted below it
// (a guest's disk or agent dir: something uses it still).
func (n *Node) reapGuestDirs(ctx context.Context, held map[string]bool) {
	ls, ok := n.Driver.(lister)
	if !ok {
		return
	}
	ids, err := ls.List(ctx)
	if err != nil {
		return // reapOrphans warned
	}
	for _, id := range ids {
		held[id] = true
	}
	es, err := os.ReadDir(filepath.Join(n.DataDir, "guests"))
	if err != nil {
		n.Logger.Warn("node: guests' dirs", "err", err)
		return
	}
	for _, e := range es {
		dir := n.guestDir(e.Name())
		if held[e.Name()] || !e.IsDir() {
			continue
		}
		if mountedBelow(dir) {
			n.Logger.Warn("node: a dir of no guest of this node's has a mount below it, and is left", "dir", dir)
			continue
		}
		if err := removeAll(dir); err != nil {
			n.Logger.Warn("node: remove the dir of a guest that is gone", "dir", dir, "err", err)
			continue
		}
		n.Logger.Info("node: removed the dir of a guest that is gone", "dir", dir)
	}
}

// mountedBelow reports whether anything is mounted on dir or below it (true when the mount
// table cannot be read, or dir resolved). The table names mount points resolved, with
// spaces and the like escaped: dir is compared so, since a data dir through a symlink (or
// with a space) matched none, and os.RemoveAll went into a guest's mounted disk.
func mountedBelow(dir string) bool {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return true
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return true
	}
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) > 4 {
			if p := unescapeMountPoint(f[4]); p == dir || strings.HasPrefix(p, dir+"/") {
				return true
			}
		}
	}
	return false
}

// unescapeMountPoint undoes the mount table's octal escapes (\040 a space, \011, \012, \134).
func unescapeMountPoint(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// reconcile destroys the running or paused guests whose sessions ended elsewhere while the
// node kept them: the placer declared a host failure when the node's heartbeat lapsed (a
// loaded machine, a slow Redis) though the node lived, or it was deleted meanwhile. Without
// it such a guest runs, and is metered, until its own timers end it. It also stops the
// guests whose sessions have been stopping for missedStopAfter with no stop come here.
func (n *Node) reconcile(ctx context.Context) {
	var ls []*live
	var refs []store.SessionRef
	for _, l := range n.all() {
		if !l.mu.TryLock() {
			continue // an operation holds it (a restore, for minutes): a later round looks
		}
		st, ref := l.g.State, store.SessionRef{Project: l.g.Project, ID: l.g.SessionID}
		l.mu.Unlock()
		if st == session.Running || st == session.Paused {
			ls, refs = append(ls, l), append(refs, ref)
		}
	}
	if len(refs) == 0 {
		return
	}
	rctx, cancel := n.redis(ctx)
	states, err := n.Store.States(rctx, refs)
	cancel()
	if err != nil {
		return // Redis is away: keep the guests and their timers
	}
	now := time.Now()
	for i, l := range ls {
		// Only an ended session: one that is gone may be Redis's loss (a restart without
		// persistence, a failover), not the control plane's decision.
		switch {
		case states[i].Terminal():
			// In the background: the guest's lock may be taken since, and a guest's stop
			// takes seconds; the other guests' reconcile waits for neither.
			state := states[i]
			n.goBackground(func() { n.endedHere(n.ctx, l, state) })
		case states[i] != session.Stopping:
			l.stopSeen = time.Time{}
		case l.stopSeen.IsZero():
			l.stopSeen = now
		case now.Sub(l.stopSeen) >= missedStopAfter:
			l.stopSeen = time.Time{}
			// In the background: the stop waits for the guest's lock (a restore may hold it a
			// minute or two), and the other guests' reconcile must not.
			ref := refs[i]
			n.goBackground(func() { n.stopMissed(n.ctx, ref) })
		}
	}
}

// missedStopAfter is how long a session may be stopping in Redis while its guest runs here
// before the node takes it that the stop will not come: far longer than a stop takes to
// arrive, even one that waits for the guest's lock behind a snapshot's restore.
const missedStopAfter = 30 * time.Second

// stopMissed stops a guest whose session the control plane moved to stopping without the
// node hearing of it (its gateway died between the two), for the reason Redis gives: else
// the guest would run, and the session stay stopping, for ever (the guest's timers end
// only what runs, and their transition from running is refused).
func (n *Node) stopMissed(ctx context.Context, ref store.SessionRef) {
	rctx, cancel := n.redis(ctx)
	s, err := n.Store.Get(rctx, ref.Project, ref.ID)
	cancel()
	if err != nil || s.State != session.Stopping {
		return // Redis away, or it moved on meanwhile: the next look sees
	}
	n.Logger.Warn("node: the session is stopping, and its stop never came here; stopping its guest",
		"session", ref.ID, "reason", deref((*string)(s.StateReason)), "stopping_for", missedStopAfter)
	if err := n.Stop(ctx, s); err != nil {
		n.Logger.Error("node: stop a guest whose stop never came", "session", ref.ID, "err", err)
	}
}

// endedHere destroys the live guest l, whose session the control plane ended (as state).
// What the guest used until now is still recorded.
func (n *Node) endedHere(ctx context.Context, l *live, state session.State) {
	l.mu.Lock()
	g := l.g
	if g.State != session.Running && g.State != session.Paused {
		l.mu.Unlock()
		return
	}
	n.Logger.Warn("node: session ended elsewhere while its guest ran here; destroying the guest",
		"session", g.SessionID, "state", state)
	l.stopEgress() // before the meter, which then bills every byte that went out
	n.sample(ctx, l)
	n.kill(ctx, l)
	g.State = state
	n.save(l)
	guestID := g.GuestID
	l.mu.Unlock()
	n.flush(ctx, l)
	n.remove(ctx, guestID)
	n.pool.kick()
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
	n.forgetJournal(l, g.SessionID)
	return true
}

// snapshotDir answers the directory of snapshot id. The id comes from the control plane (a
// create's restore_from), so anything but a snapshot id is refused: the path never leaves
// DataDir/snapshots.
func (n *Node) snapshotDir(id string) (string, error) {
	if !session.ValidID("snap_", id) {
		return "", &session.FieldError{Field: "snapshot_id", Message: fmt.Sprintf("%q is not a snapshot id (snap_ and 18 letters or digits)", id)}
	}
	return filepath.Join(n.DataDir, "snapshots", id), nil
}

// endProcsTimeout bounds the node's request that a guest's agent end its processes: the
// agent, starved by what it ends on a loaded host, took seconds for its kill rounds.
const endProcsTimeout = 20 * time.Second

// endGuestProcs has guest watched's agent end every process of the guest: its sandbox nears
// its host process limit (hypervisor.EventPids, detail says how near), where it would die
// with whatever the guest ran, and the agent's own fork-bomb guard, which counts the guest's
// processes and not what they cost the host, has not ended them. One request at a time per
// guest; the driver reports again only as the count grows on, and only then is the agent
// asked again. An agent that cannot end them (one from before the request, in a guest
// adopted from an older node) is not asked again, and the session runs on as it did before
// the request: its sandbox's host tasks do not fall back once its processes end, so one past
// half its limit may stay there for good, and stopping it would fail a session that has not
// died (should it reach its limit, it dies: guest_crash). The caller holds l.mu.
func (n *Node) endGuestProcs(l *live, watched, detail string) {
	sess := l.g.SessionID
	if l.noEnd == watched {
		return
	}
	var ctx context.Context
	ok := false
	if l.agent != nil {
		ctx, ok = l.ending.begin(n.ctx)
	}
	if l.direct != nil {
		// No agent to end its processes: the guest runs one run's code, and is stopped, its
		// run with it (answered 137, as a SIGKILL), well before its sandbox's limit.
		n.Metrics.guestProcsEnded("stopped")
		n.Logger.Warn("node: a direct guest's sandbox neared its host process limit (a fork bomb in a tier-1 run?): it has no agent to end its processes, and is stopped", "session", sess, "guest", watched, "detail", detail)
		n.stopGuest(watched)
		return
	}
	if !ok {
		n.Logger.Info("node: the guest's sandbox nears its process limit; its processes are being ended already", "session", sess, "guest", watched, "detail", detail)
		return
	}
	c := l.agent
	started := n.goBackground(func() {
		t0 := time.Now()
		ended, err := c.EndProcs(ctx)
		paused := l.ending.done()
		switch {
		case paused:
			n.Metrics.guestProcsEnded("paused")
			n.Logger.Warn("node: the guest's sandbox neared its host process limit (a fork bomb?), and its session was paused while its agent ended the guest's processes: the request is given up (a frozen agent answers none; asked again if the count grows on once it runs)",
				"session", sess, "guest", watched, "detail", detail, "took", time.Since(t0).Round(time.Millisecond), "err", err)
		case err == nil:
			n.Metrics.guestProcsEnded("ended")
			n.Logger.Warn("node: the guest's sandbox neared its host process limit (a fork bomb?): its agent ended every process of the guest",
				"session", sess, "guest", watched, "detail", detail, "ended", ended, "took", time.Since(t0).Round(time.Millisecond))
		case agent.EndUnsupported(err):
			l.mu.Lock()
			l.noEnd = watched
			l.mu.Unlock()
			n.Metrics.guestProcsEnded("unsupported")
			n.Logger.Warn("node: the guest's sandbox neared its host process limit (a fork bomb?) and its agent cannot end the guest's processes (an older agent?): it is not asked again, and the sandbox dies should it reach that limit",
				"session", sess, "guest", watched, "detail", detail, "err", err)
		default:
			n.Metrics.guestProcsEnded("failed")
			n.Logger.Warn("node: the guest's sandbox neared its host process limit (a fork bomb?); its agent did not end the guest's processes (asked again if the count grows on)",
				"session", sess, "guest", watched, "detail", detail, "took", time.Since(t0).Round(time.Millisecond), "err", err)
		}
	})
	if !started {
		l.ending.done()
	}
}

// procEnd is the node's request that a guest's agent end its processes: one at a time, and
// given up when the guest is paused (its agent, frozen, would answer nothing until
// endProcsTimeout, and the guest's next request would wait for that), or begun while it is.
type procEnd struct {
	mu     sync.Mutex
	cancel context.CancelFunc // the request in flight's; nil when none is
	paused bool               // the guest was paused while it was in flight
	frozen bool               // the guest is paused (pause, until resume)
}

// begin answers the context of a new request, bounded by endProcsTimeout, or false while
// another is in flight. A request begun ends with done. One begun while the guest is paused
// (relieveHostTasks asks without the guest's lock: a pause after its look and before its
// request found none to cut short) is given up at once: its context has ended, and done
// answers paused.
func (e *procEnd) begin(parent context.Context) (context.Context, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cancel != nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(parent, endProcsTimeout)
	e.cancel, e.paused = cancel, e.frozen
	if e.frozen {
		cancel()
	}
	return ctx, true
}

// done ends the request in flight, answering whether the guest was paused meanwhile.
func (e *procEnd) done() (paused bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cancel != nil {
		e.cancel()
		e.cancel = nil
	}
	return e.paused
}

// pause gives up the request in flight, if any, and any begun until resume: the guest is
// frozen.
func (e *procEnd) pause() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.frozen = true
	if e.cancel != nil {
		e.cancel()
		e.paused = true
	}
}

// resume lets requests be made again: the guest runs.
func (e *procEnd) resume() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.frozen = false
}
