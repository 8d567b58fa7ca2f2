package placer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"wb/session"
	"wb/store"
)

// Provisioner asks a node to start a placed session's guest. The node then moves the
// session provisioning → running (or failed).
type Provisioner interface {
	Provision(ctx context.Context, node store.NodeInfo, sess *session.Session) error
}

// Config wires a Placer.
type Config struct {
	Store       *store.Store
	Provisioner Provisioner
	// Tiers give the provisioning deadlines; give the store the same (store.WithTiers).
	Tiers session.Tiers
	// HeartbeatTimeout: a node silent for longer is dead and its sessions fail with
	// host_failure. Default DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration
	// FullSweepEvery: how often, besides at start, the placer visits every project with
	// sessions, to place what a lost signal left pending and repair the indexes it works
	// from. Default 5 min.
	FullSweepEvery time.Duration
	// Consumer names this placer in the placers' consumer group of pending signals: unique
	// per placer, and the same across its restarts. Default host-pid.
	Consumer string
	Logger   *slog.Logger
	Now      func() time.Time
}

// signalGroup is the placers' consumer group on the pending signals.
const signalGroup = "placer"

// maxWait bounds one blocking read of signals, so that signals a dead placer left are
// claimed (store.Signals) even on a platform with nothing else to do.
const maxWait = 10 * time.Second

// retryAfter is how long the placer waits after Redis failed it.
const retryAfter = time.Second

// retryWaiting is how often pending sessions that found no room are tried again.
const retryWaiting = 500 * time.Millisecond

// Placer is safe for concurrent use; run one or more (placements are compare-and-set).
type Placer struct {
	Config
	mu sync.Mutex // guards waiting and resumed
	// waiting holds the projects whose pending sessions found no room: room frees up with
	// no signal (a session ends, a node's heartbeat shows more free), so they are retried.
	waiting map[string]bool
	// resumed is when Run's wait last ended late (see stallSlack): heartbeats are judged from
	// then at the earliest, since the placer could not have seen the ones it missed.
	resumed time.Time
	wg      sync.WaitGroup
}

// DefaultHeartbeatTimeout is Config.HeartbeatTimeout's default.
const DefaultHeartbeatTimeout = 10 * time.Second

// New returns a Placer.
func New(cfg Config) *Placer {
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if cfg.FullSweepEvery == 0 {
		cfg.FullSweepEvery = 5 * time.Minute
	}
	if cfg.Consumer == "" {
		h, _ := os.Hostname()
		cfg.Consumer = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Tiers == (session.Tiers{}) {
		cfg.Tiers = session.DefaultTiers()
	}
	return &Placer{Config: cfg, waiting: map[string]bool{}}
}

// Run works until ctx ends. It sweeps once at start, then waits on signals of pending
// sessions (store.WorkPending) and places their projects, and wakes on its own only when a
// provisioning deadline or a node's heartbeat may lapse, and for the rare full sweep: an
// idle platform costs it a few commands every few seconds, however many projects it holds.
func (p *Placer) Run(ctx context.Context) error {
	defer p.wg.Wait()
	p.sweepProjects(ctx)
	now := p.Now()
	nextSweep := now.Add(p.FullSweepEvery)
	var nextNodes, nextDeadline, nextRetry time.Time // zero: due now
	for ctx.Err() == nil {
		now = p.Now()
		if !now.Before(nextSweep) {
			p.sweepProjects(ctx)
			nextSweep = now.Add(p.FullSweepEvery)
		}
		waiting := p.waitingProjects()
		if len(waiting) > 0 && !now.Before(nextRetry) {
			for _, project := range waiting {
				p.PlaceProject(ctx, project)
			}
			nextRetry = now.Add(retryWaiting)
		}
		if !now.Before(nextNodes) {
			nextNodes = p.checkNodes(ctx, now)
		}
		// Read every round: a session created meanwhile may fall due before the one known.
		nextDeadline = p.expireDeadlines(ctx, now)
		wake := earliest(nextSweep, nextNodes, now.Add(maxWait))
		if !nextDeadline.IsZero() {
			wake = earliest(wake, nextDeadline)
		}
		if len(waiting) > 0 {
			wake = earliest(wake, nextRetry)
		}
		if !wake.After(now) {
			continue
		}
		sigs, err := p.Store.Signals(ctx, store.WorkPending, signalGroup, p.Consumer, wake.Sub(now), 64)
		// The wait overran: this process or Redis stalled (a busy round of placements does
		// not count: it is not a wait).
		if back := p.Now(); back.Sub(wake) > p.stallSlack() {
			p.noteStall(back, back.Sub(wake))
		}
		if err != nil {
			if ctx.Err() == nil {
				p.Logger.Error("placer: read pending signals", "err", err)
				sleep(ctx, retryAfter)
			}
			continue
		}
		for _, project := range store.SignalProjects(sigs) {
			p.PlaceProject(ctx, project)
		}
		if ctx.Err() != nil {
			return nil // not acknowledged: read again by this consumer, or claimed by another
		}
		if err := p.Store.AckSignals(ctx, store.WorkPending, signalGroup, sigs); err != nil {
			p.Logger.Warn("placer: acknowledge signals", "err", err)
		}
	}
	return nil
}

func earliest(t time.Time, more ...time.Time) time.Time {
	for _, u := range more {
		if u.Before(t) {
			t = u
		}
	}
	return t
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// PlaceProject places every pending session of project that fits on a live node. Placements
// of one project are serialized across placers (Store.LockPlacement), so that its share of a
// node is checked against every placement already made; when another placer is placing the
// project, that one places this round too.
func (p *Placer) PlaceProject(ctx context.Context, project string) {
	lock, pending, err := p.Store.LockPlacement(ctx, project)
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: lock", "project", project, "err", err)
		}
		p.setWaiting(project, true)
		return
	}
	if !pending {
		p.setWaiting(project, false)
	}
	if lock == nil {
		// Another placer holds the lock and was asked for another round; should its round
		// have died (its Redis primary killed mid-round) it makes none, so the project is
		// retried as one waiting for room is, until this placer gets the lock.
		p.setWaiting(project, pending)
		return
	}
	for {
		p.setWaiting(project, p.placeProject(ctx, project))
		again, err := lock.Done(context.WithoutCancel(ctx))
		if err != nil {
			p.Logger.Warn("placer: unlock", "project", project, "err", err)
			return
		}
		if !again {
			return
		}
		if ctx.Err() != nil {
			if err := lock.Release(context.WithoutCancel(ctx)); err != nil {
				p.Logger.Warn("placer: unlock", "project", project, "err", err)
			}
			return
		}
	}
}

// placeProject places what it can of the project's pending sessions; it answers true when
// some stay pending (no room yet, or an error).
func (p *Placer) placeProject(ctx context.Context, project string) (left bool) {
	const most = 256
	now := p.Now()
	v, err := p.Store.ReadPlacement(ctx, project, most, now, p.claimWindow(), func(n store.NodeInfo) bool { return p.live(now, n) })
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: read placement", "project", project, "err", err)
		}
		return true
	}
	left = v.More
	share := &share{pct: v.Project.NodeSharePct, used: v.Usage}
	for _, sess := range v.Pending {
		id := sess.ID
		img, err := p.restoreImage(ctx, sess)
		if err != nil {
			if ctx.Err() == nil {
				p.Logger.Error("placer: read the snapshot to restore", "session", id, "err", err)
			}
			left = true
			continue
		}
		node, claim, ok, err := p.choose(ctx, v.Nodes, v.Claims, sess, img, share)
		if err != nil {
			if ctx.Err() == nil {
				p.Logger.Error("placer: claim room on a node", "session", id, "err", err)
			}
			left = true
			continue
		}
		if !ok {
			left = true // stays pending: retried until room frees up or its deadline fails it
			continue
		}
		share.add(node.ID, sess)
		out, err := p.Store.Transition(ctx, store.Change{Project: project, ID: id, From: session.Pending,
			To: session.Provisioning, Driver: session.Placer, Version: sess.Version, Zone: node.Zone, NodeID: node.ID})
		if err != nil {
			var ce *store.ConflictError
			if !errors.As(err, &ce) { // a conflict means another placer or a DELETE won
				p.Logger.Error("placer: place", "session", id, "err", err)
				left = true
			}
			p.release(context.WithoutCancel(ctx), node.ID, claim)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if err := p.Provisioner.Provision(ctx, node, out); err != nil && ctx.Err() == nil {
				// The provisioning deadline fails the session if the node never reports.
				p.Logger.Error("placer: provision", "session", id, "node", node.ID, "err", err)
			}
		}()
	}
	return left
}

// setWaiting records whether project has pending sessions that found no room, which Run
// retries every retryWaiting until they place or their deadline fails them.
func (p *Placer) setWaiting(project string, waiting bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if waiting {
		p.waiting[project] = true
	} else {
		delete(p.waiting, project)
	}
}

func (p *Placer) waitingProjects() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.waiting))
	for project := range p.waiting {
		out = append(out, project)
	}
	return out
}

// share is what one project holds on each node, against its plan's share of any node.
type share struct {
	pct  int
	used map[string]store.NodeUse
}

// fits reports whether sess keeps the project within its share of node n.
func (sh *share) fits(n store.NodeInfo, sess *session.Session) bool {
	u := sh.used[n.ID]
	return (u.VCPU+sess.Resources.VCPU)*100 <= n.VCPU*sh.pct &&
		(u.MemoryMiB+sess.Resources.MemoryMiB)*100 <= n.MemoryMiB*sh.pct
}

func (sh *share) add(node string, sess *session.Session) {
	u := sh.used[node]
	u.VCPU += sess.Resources.VCPU
	u.MemoryMiB += sess.Resources.MemoryMiB
	sh.used[node] = u
}

// restoreImage is the root disk image a node must have to place sess on it: that of the memory
// snapshot it restores, whose memory only a node with that image can restore
// (session.SnapshotRecord.RootImage); "" when any node will do. A node that advertises no
// images (an earlier wb's, during a rolling deploy, or another back end's) is not one: an
// earlier wb's images are of its own binary, never the one a snapshot of this wb names.
func (p *Placer) restoreImage(ctx context.Context, sess *session.Session) (string, error) {
	if sess.RestoreFrom == nil {
		return "", nil
	}
	var snap session.SnapshotRecord
	err := p.Store.GetObject(ctx, sess.ProjectID, store.KindSnapshot, *sess.RestoreFrom, &snap)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil // deleted since the create: the node's restore says so
	}
	if err != nil {
		return "", err
	}
	if !snap.IncludeMemory {
		return "", nil
	}
	return snap.RootImage, nil
}

// choose picks the live node in the session's region, not draining, that offers its tier,
// has the root disk image img when that is set (restoreImage), has room within the project's
// share of it, and has the most free memory after the claims
// of placements its heartbeat may not show yet; it claims the session's resources on it.
// The claims are in Redis (Store.ClaimOnNode), shared by every placer, and a claim is
// checked and made in one script: placers of several gateways placing at once never fill the
// same room; the script checks it against the node's heartbeat as it is then, since this
// round's read of it may be stale by a stall. A node whose room another placer took since the
// read is passed for the next. claims is the round's read of the nodes' claims; choose adds
// the one it makes, and answers it, for release should the placement not happen.
func (p *Placer) choose(ctx context.Context, nodes []store.NodeInfo, claims map[string]store.NodeUse, sess *session.Session, img string, sh *share) (store.NodeInfo, store.Claim, bool, error) {
	now := p.Now()
	var cands []store.NodeInfo
	for _, n := range nodes {
		if !CanHost(n, sess.Region, sess.Tier, img, now, p.HeartbeatTimeout) || !sh.fits(n, sess) {
			continue
		}
		cands = append(cands, n)
	}
	type ranked struct {
		n              store.NodeInfo
		memAfterClaims int
	}
	var fit []ranked
	for _, n := range cands {
		c := claims[n.ID]
		vcpu, mem := n.VCPU-n.UsedVCPU-c.VCPU, n.MemoryMiB-n.UsedMemoryMiB-c.MemoryMiB
		if vcpu >= sess.Resources.VCPU && mem >= sess.Resources.MemoryMiB {
			fit = append(fit, ranked{n, mem})
		}
	}
	slices.SortStableFunc(fit, func(a, b ranked) int { return b.memAfterClaims - a.memAfterClaims })
	for _, r := range fit {
		n := r.n
		claim, ok, err := p.Store.ClaimOnNode(ctx, store.ClaimAsk{Node: n, Session: sess.ID, Project: sess.ProjectID,
			VCPU: sess.Resources.VCPU, MemoryMiB: sess.Resources.MemoryMiB, SharePct: sh.pct}, now, p.claimWindow())
		if err != nil {
			return store.NodeInfo{}, store.Claim{}, false, err
		}
		if ok {
			c := claims[n.ID]
			c.VCPU += sess.Resources.VCPU
			c.MemoryMiB += sess.Resources.MemoryMiB
			claims[n.ID] = c
			return n, claim, true, nil
		}
	}
	return store.NodeInfo{}, store.Claim{}, false, nil
}

// live reports whether node n takes new sessions at now: it beats, and no operator drains it.
func (p *Placer) live(now time.Time, n store.NodeInfo) bool {
	return Live(n, now, p.HeartbeatTimeout)
}

// Live reports whether node n takes new sessions at now, with a heartbeat timeout of
// timeout: it beats, and no operator drains it.
func Live(n store.NodeInfo, now time.Time, timeout time.Duration) bool {
	return !n.Draining && now.Sub(n.HeartbeatAt) <= timeout
}

// CanHost reports whether the placer may place a session of region and tier on node n at now
// (a heartbeat timeout of timeout), room aside: n is live, of the region, offers the tier and,
// when img is set (a memory snapshot's restore), has that root disk image. The gateway asks it
// too, to refuse at the create a restore no node can take (the one place the rule is written).
func CanHost(n store.NodeInfo, region string, tier int, img string, now time.Time, timeout time.Duration) bool {
	return Live(n, now, timeout) && n.Region == region && slices.Contains(n.Tiers, tier) &&
		(img == "" || slices.Contains(n.Images, img))
}

// claimWindow is how long a placement's claim counts against its node: until its heartbeat
// surely shows the session.
func (p *Placer) claimWindow() time.Duration { return 2 * p.HeartbeatTimeout }

// release drops this placer's claim on node, whose placement did not happen: its own only,
// since another placer that placed the same session there holds a claim of its own.
func (p *Placer) release(ctx context.Context, node string, claim store.Claim) {
	if err := p.Store.ReleaseOnNode(ctx, node, claim); err != nil && ctx.Err() == nil {
		// It lapses with its window: the node's room is held that long.
		p.Logger.Warn("placer: release claim", "session", claim.Session, "node", node, "err", err)
	}
}

// Sweep does at once what Run does over time: it places every project's pending sessions,
// repairs the indexes, fails the sessions past their provisioning deadline and those of
// nodes whose heartbeat lapsed.
func (p *Placer) Sweep(ctx context.Context) {
	p.sweepProjects(ctx)
	now := p.Now()
	p.checkNodes(ctx, now)
	for {
		next := p.expireDeadlines(ctx, now)
		if !next.Equal(now) {
			return
		}
	}
}

// sweepProjects is the one walk over every project, at start and every FullSweepEvery: it
// drops the index entries of ended sessions whose retention lapsed (store.TrimLapsed), and a
// round trip per few hundred projects finds the few with sessions; for each, it places what
// is pending (its signal may have been lost) and indexes its sessions' deadlines and nodes
// where an entry is missing (a crash between a write and its index, or sessions written
// before the indexes existed).
func (p *Placer) sweepProjects(ctx context.Context) {
	if err := p.Store.ForgetIdleConsumers(ctx, store.WorkPending, signalGroup, store.IdleConsumerAge); err != nil && ctx.Err() == nil {
		p.Logger.Warn("placer: forget idle consumers", "err", err)
	}
	projects, err := p.Store.Projects(ctx)
	if err == nil {
		if err := p.Store.TrimLapsed(ctx, projects); err != nil && ctx.Err() == nil {
			p.Logger.Warn("placer: trim lapsed sessions' index entries", "err", err)
		}
		projects, err = p.Store.ActiveProjects(ctx, projects)
	}
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: sweep", "err", err)
		}
		return
	}
	for _, project := range projects {
		if ctx.Err() != nil {
			return
		}
		p.PlaceProject(ctx, project)
		p.reindex(ctx, project)
	}
}

// reindex records the provisioning deadline of the project's pending and provisioning
// sessions, the node of its placed ones, and a lease on the snapshot of those in
// snapshotting, where missing.
func (p *Placer) reindex(ctx context.Context, project string) {
	for _, st := range []session.State{session.Pending, session.Provisioning, session.Running, session.Paused,
		session.Snapshotting, session.Stopping} {
		ids, err := p.Store.IDsInState(ctx, project, st, 100000)
		if err != nil {
			p.Logger.Error("placer: reindex", "project", project, "err", err)
			return
		}
		for _, id := range ids {
			sess, err := p.Store.Get(ctx, project, id)
			if err != nil {
				continue
			}
			ref := store.SessionRef{Project: project, ID: id}
			if at, ok := p.deadline(sess); ok && (sess.State == session.Pending || sess.State == session.Provisioning) {
				err = p.Store.ScheduleProvisionDeadline(ctx, ref, at, false)
			}
			if sess.State == session.Snapshotting {
				err = p.Store.EnsureSnapshotWork(ctx, ref, p.Now().Add(orphanSnapshotWait))
			}
			if err == nil && sess.NodeID != "" && !sess.State.Terminal() {
				err = p.Store.AddNodeSession(ctx, sess.NodeID, ref)
			}
			if err != nil && ctx.Err() == nil {
				p.Logger.Error("placer: reindex", "session", id, "err", err)
			}
		}
	}
}

// orphanSnapshotWait is how long a session in snapshotting that no gateway holds a lease on
// (one died between the transition and taking the lease) is given before a gateway's
// recovery returns it to running: longer than a snapshot's upload, which a gateway's lease
// would cover if it had one.
const orphanSnapshotWait = 10 * time.Minute

// deadline is when sess must have left pending and provisioning.
func (p *Placer) deadline(sess *session.Session) (time.Time, bool) {
	tier, err := p.Tiers.Tier(sess.Tier)
	if err != nil {
		return time.Time{}, false
	}
	return sess.CreatedAt.Add(tier.ProvisionDeadline()), true
}

// expireDeadlines fails the sessions (up to a batch) whose provisioning deadline is past
// and answers when the next falls due (zero: none; now: more are due, or Redis failed).
func (p *Placer) expireDeadlines(ctx context.Context, now time.Time) time.Time {
	due, next, err := p.Store.DueProvisionDeadlines(ctx, now, 256)
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: provisioning deadlines", "err", err)
		}
		return now.Add(retryAfter)
	}
	var done []store.SessionRef
	for _, ref := range due {
		if p.expire(ctx, ref, now) {
			done = append(done, ref)
		}
	}
	if err := p.Store.ForgetProvisionDeadlines(ctx, done...); err != nil && ctx.Err() == nil {
		p.Logger.Warn("placer: provisioning deadlines", "err", err)
	}
	// Entries not settled (an error, a conflict, a deadline moved) are tried again soon,
	// not at once; and at once only while the batches make progress.
	retry := now.Add(retryAfter)
	switch {
	case len(done) == len(due):
	case len(done) == 0:
		return retry
	case next.IsZero() || next.After(retry):
		return retry
	}
	return next
}

// expire fails the session with provision_timeout if it is still pending or provisioning
// past its deadline. It answers true when the session needs no deadline any more (it left
// provisioning, it is gone, or it failed now); a deadline the placer's tiers put later is
// moved there, and answers false after that too (the entry stays, with its new time).
func (p *Placer) expire(ctx context.Context, ref store.SessionRef, now time.Time) bool {
	sess, err := p.Store.Get(ctx, ref.Project, ref.ID)
	if errors.Is(err, store.ErrNotFound) {
		return true
	}
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: provisioning deadline", "session", ref.ID, "err", err)
		}
		return false
	}
	if sess.State != session.Pending && sess.State != session.Provisioning {
		return true
	}
	at, ok := p.deadline(sess)
	if !ok {
		return true // a tier the placer does not know: no deadline, as before the index
	}
	if at.After(now) {
		if err := p.Store.ScheduleProvisionDeadline(ctx, ref, at, true); err != nil && ctx.Err() == nil {
			p.Logger.Error("placer: provisioning deadline", "session", ref.ID, "err", err)
		}
		return false
	}
	_, err = p.Store.Transition(ctx, store.Change{Project: ref.Project, ID: ref.ID, From: sess.State, To: session.Failed,
		Driver: session.Timer, Reason: session.ProvisionTimeout, Version: sess.Version})
	if err != nil {
		var ce *store.ConflictError
		if !errors.As(err, &ce) && ctx.Err() == nil {
			p.Logger.Error("placer: provisioning deadline", "session", ref.ID, "err", err)
		}
		return false // it moved meanwhile: look again
	}
	tier, _ := p.Tiers.Tier(sess.Tier)
	p.Logger.Warn("provisioning deadline passed", "session", ref.ID, "state", sess.State, "deadline", tier.ProvisionDeadline())
	return true
}

// stallSlack is how much later than it meant to Run's wait for signals may end before the
// placer counts itself stalled: its process or host paused (a loaded host, a guest's syscall storm
// under gVisor's ptrace platform stalled this one for over ten seconds), or Redis answered
// that late. Heartbeats that were due meanwhile could not have been seen in time.
func (p *Placer) stallSlack() time.Duration { return max(time.Second, p.HeartbeatTimeout/5) }

// noteStall records that Run's wait ended late: from now on a node's heartbeat lapses
// HeartbeatTimeout after now at the earliest, so that a node that was stalled with the
// placer, or whose heartbeats the placer could not read, is not failed for it.
func (p *Placer) noteStall(now time.Time, late time.Duration) {
	p.mu.Lock()
	p.resumed = now
	p.mu.Unlock()
	p.Logger.Warn("placer: woke up late; nodes get a full heartbeat timeout from now", "late", late, "heartbeat_timeout", p.HeartbeatTimeout)
}

// checkNodes fails the sessions of every node whose heartbeat lapsed, and answers when to
// look again: when the next heartbeat known may lapse, or after HeartbeatTimeout (a node
// that registers meanwhile cannot lapse sooner). A heartbeat lapses HeartbeatTimeout after
// it was written, or after the placer last woke up from a stall, whichever is later.
func (p *Placer) checkNodes(ctx context.Context, now time.Time) time.Time {
	nodes, err := p.Store.Nodes(ctx)
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: list nodes", "err", err)
		}
		return now.Add(retryAfter)
	}
	p.mu.Lock()
	resumed := p.resumed
	p.mu.Unlock()
	next := now.Add(p.HeartbeatTimeout)
	for _, n := range nodes {
		lapse := latest(n.HeartbeatAt, resumed).Add(p.HeartbeatTimeout)
		if now.After(lapse) {
			p.nodeFailed(ctx, n.ID)
		} else {
			next = earliest(next, lapse.Add(time.Millisecond))
		}
	}
	return next
}

// nodeFailed fails every session on a dead node with host_failure, from the node's index
// of sessions (no project is walked), and forgets the node.
func (p *Placer) nodeFailed(ctx context.Context, node string) {
	refs, err := p.Store.NodeSessions(ctx, node)
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: host failure", "node", node, "err", err)
		}
		return
	}
	var done []store.SessionRef
	for _, ref := range refs {
		if p.hostFailure(ctx, node, ref) {
			done = append(done, ref)
		}
	}
	if err := p.Store.ForgetNodeSessions(ctx, node, done...); err != nil && ctx.Err() == nil {
		p.Logger.Warn("placer: host failure", "node", node, "err", err)
	}
	if len(done) < len(refs) {
		return // the node stays registered, and dead: the next check tries the rest
	}
	p.Logger.Warn("placer: node heartbeat lapsed; its sessions failed with host_failure", "node", node, "sessions", len(refs))
	if err := p.Store.RemoveNode(ctx, node); err != nil {
		p.Logger.Error("placer: remove node", "node", node, "err", err)
	}
}

// hostFailure fails one session of a dead node; it answers true when the session is no
// longer on the node (failed now, ended before, gone, or placed elsewhere).
func (p *Placer) hostFailure(ctx context.Context, node string, ref store.SessionRef) bool {
	for range 3 { // a conflict: the session moved meanwhile; look again
		sess, err := p.Store.Get(ctx, ref.Project, ref.ID)
		if errors.Is(err, store.ErrNotFound) {
			return true
		}
		if err != nil {
			if ctx.Err() == nil {
				p.Logger.Error("placer: host failure", "session", ref.ID, "err", err)
			}
			return false
		}
		if sess.NodeID != node || sess.State.Terminal() {
			return true
		}
		_, err = p.Store.Transition(ctx, store.Change{Project: ref.Project, ID: ref.ID, From: sess.State, To: session.Failed,
			Driver: session.Placer, Reason: session.HostFailure, Version: sess.Version})
		var ce *store.ConflictError
		if err == nil {
			return true
		}
		if !errors.As(err, &ce) {
			if ctx.Err() == nil {
				p.Logger.Error("placer: host failure", "session", ref.ID, "err", err)
			}
			return false
		}
	}
	return false
}

func latest(t, u time.Time) time.Time {
	if u.After(t) {
		return u
	}
	return t
}
