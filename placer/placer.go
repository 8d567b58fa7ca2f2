package placer

import (
	"context"
	"errors"
	"log/slog"
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
	Tiers       session.Tiers
	// HeartbeatTimeout: a node silent for longer is dead and its sessions fail with
	// host_failure. Default 10 s.
	HeartbeatTimeout time.Duration
	// SweepEvery: how often deadlines, dead nodes and unplaced sessions are checked. Default 500 ms.
	SweepEvery time.Duration
	Logger     *slog.Logger
	Now        func() time.Time
}

// Placer is safe for concurrent use; run one or more (placements are compare-and-set).
type Placer struct {
	Config
	kicks chan string
	mu    sync.Mutex
	// inflight holds placements not yet reflected in the node's heartbeat.
	inflight map[string][]claim
	wg       sync.WaitGroup
}

type claim struct {
	vcpu, mem int
	at        time.Time
}

// New returns a Placer.
func New(cfg Config) *Placer {
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = 10 * time.Second
	}
	if cfg.SweepEvery == 0 {
		cfg.SweepEvery = 500 * time.Millisecond
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
	return &Placer{Config: cfg, kicks: make(chan string, 1024), inflight: map[string][]claim{}}
}

// Kick tells the placer that project has a new pending session. It never blocks.
func (p *Placer) Kick(project string) {
	select {
	case p.kicks <- project:
	default: // full: the next sweep places it
	}
}

// Run places on kicks (in-process and over Redis Pub/Sub) and sweeps periodically, until
// ctx ends.
func (p *Placer) Run(ctx context.Context) error {
	remote, stop := p.Store.PlacerKicks(ctx)
	defer stop()
	tick := time.NewTicker(p.SweepEvery)
	defer tick.Stop()
	defer p.wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case project := <-p.kicks:
			p.PlaceProject(ctx, project)
		case project, ok := <-remote:
			if !ok {
				remote = nil // the subscription ended; sweeps go on
				continue
			}
			p.PlaceProject(ctx, project)
		case <-tick.C:
			p.Sweep(ctx)
		}
	}
}

// PlaceProject places every pending session of project that fits on a live node. Placements
// of one project are serialized across placers (Store.LockPlacement), so that its share of a
// node is checked against every placement already made; when another placer is placing the
// project, that one places this round too.
func (p *Placer) PlaceProject(ctx context.Context, project string) {
	// Most projects have nothing pending most of the time: look before taking the lock.
	if ids, err := p.Store.IDsInState(ctx, project, session.Pending, 1); err != nil || len(ids) == 0 {
		if err != nil && ctx.Err() == nil {
			p.Logger.Error("placer: list pending", "project", project, "err", err)
		}
		return
	}
	lock, err := p.Store.LockPlacement(ctx, project)
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: lock", "project", project, "err", err)
		}
		return
	}
	if lock == nil {
		return
	}
	for {
		p.placeProject(ctx, project)
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

func (p *Placer) placeProject(ctx context.Context, project string) {
	ids, err := p.Store.IDsInState(ctx, project, session.Pending, 256)
	if err != nil {
		p.Logger.Error("placer: list pending", "project", project, "err", err)
		return
	}
	if len(ids) == 0 {
		return
	}
	nodes, err := p.Store.Nodes(ctx)
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: list nodes", "err", err)
		}
		return
	}
	share, err := p.projectShare(ctx, project)
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.Error("placer: project's share of nodes", "project", project, "err", err)
		}
		return
	}
	for _, id := range ids {
		sess, err := p.Store.Get(ctx, project, id)
		if err != nil || sess.State != session.Pending {
			continue
		}
		node, ok := p.choose(nodes, sess, share)
		if !ok {
			continue // stays pending; the deadline sweep fails it if nothing frees up
		}
		share.add(node.ID, sess)
		out, err := p.Store.Transition(ctx, store.Change{Project: project, ID: id, From: session.Pending,
			To: session.Provisioning, Driver: session.Placer, Version: sess.Version, Zone: node.Zone, NodeID: node.ID})
		if err != nil {
			var ce *store.ConflictError
			if !errors.As(err, &ce) { // a conflict means another placer or a DELETE won
				p.Logger.Error("placer: place", "session", id, "err", err)
			}
			p.release(node.ID, sess)
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
}

// share is what one project holds on each node, against its plan's share of any node.
type share struct {
	pct  int
	used map[string]store.NodeUse
}

func (p *Placer) projectShare(ctx context.Context, project string) (*share, error) {
	proj, err := p.Store.GetProject(ctx, project)
	if err != nil {
		return nil, err
	}
	used, err := p.Store.NodeUsage(ctx, project)
	if err != nil {
		return nil, err
	}
	return &share{pct: proj.NodeSharePct, used: used}, nil
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

// choose picks the live node in the session's region that offers its tier, has room within
// the project's share of it, and has the most free memory after in-flight placements; it
// claims the session's resources on it.
func (p *Placer) choose(nodes []store.NodeInfo, sess *session.Session, sh *share) (store.NodeInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.Now()
	best, bestFree := -1, -1
	for i, n := range nodes {
		if now.Sub(n.HeartbeatAt) > p.HeartbeatTimeout || n.Region != sess.Region || !slices.Contains(n.Tiers, sess.Tier) ||
			!sh.fits(n, sess) {
			continue
		}
		vcpu, mem := n.VCPU-n.UsedVCPU, n.MemoryMiB-n.UsedMemoryMiB
		live := p.inflight[n.ID][:0]
		for _, c := range p.inflight[n.ID] {
			if now.Sub(c.at) < 2*p.HeartbeatTimeout {
				live = append(live, c)
				vcpu, mem = vcpu-c.vcpu, mem-c.mem
			}
		}
		p.inflight[n.ID] = live
		if vcpu >= sess.Resources.VCPU && mem >= sess.Resources.MemoryMiB && mem > bestFree {
			best, bestFree = i, mem
		}
	}
	if best < 0 {
		return store.NodeInfo{}, false
	}
	n := nodes[best]
	p.inflight[n.ID] = append(p.inflight[n.ID], claim{sess.Resources.VCPU, sess.Resources.MemoryMiB, now})
	return n, true
}

func (p *Placer) release(node string, sess *session.Session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cs := p.inflight[node]
	for i, c := range cs {
		if c.vcpu == sess.Resources.VCPU && c.mem == sess.Resources.MemoryMiB {
			p.inflight[node] = slices.Delete(cs, i, i+1)
			return
		}
	}
}

// Sweep places what kicks missed, fails sessions past their provisioning deadline, and fails
// the sessions of nodes whose heartbeat lapsed.
func (p *Placer) Sweep(ctx context.Context) {
	projects, err := p.Store.Projects(ctx)
	if err != nil {
		p.Logger.Error("placer: sweep", "err", err)
		return
	}
	nodes, err := p.Store.Nodes(ctx)
	if err != nil {
		p.Logger.Error("placer: sweep", "err", err)
		return
	}
	now := p.Now()
	dead := map[string]bool{}
	for _, n := range nodes {
		if now.Sub(n.HeartbeatAt) > p.HeartbeatTimeout {
			dead[n.ID] = true
		}
	}
	for _, project := range projects {
		p.PlaceProject(ctx, project)
		p.deadlines(ctx, project, now)
		if len(dead) > 0 {
			p.hostFailures(ctx, project, dead)
		}
	}
	for id := range dead {
		p.Logger.Warn("placer: node heartbeat lapsed; its sessions failed with host_failure", "node", id)
		if err := p.Store.RemoveNode(ctx, id); err != nil {
			p.Logger.Error("placer: remove node", "node", id, "err", err)
		}
	}
}

func (p *Placer) deadlines(ctx context.Context, project string, now time.Time) {
	for _, st := range []session.State{session.Pending, session.Provisioning} {
		ids, err := p.Store.IDsInState(ctx, project, st, 1024)
		if err != nil {
			p.Logger.Error("placer: deadlines", "project", project, "err", err)
			return
		}
		for _, id := range ids {
			sess, err := p.Store.Get(ctx, project, id)
			if err != nil || sess.State != st {
				continue
			}
			tier, err := p.Tiers.Tier(sess.Tier)
			if err != nil || now.Sub(sess.CreatedAt.Time) <= tier.ProvisionDeadline() {
				continue
			}
			_, err = p.Store.Transition(ctx, store.Change{Project: project, ID: id, From: st, To: session.Failed,
				Driver: session.Timer, Reason: session.ProvisionTimeout, Version: sess.Version})
			if err == nil {
				p.Logger.Warn("provisioning deadline passed", "session", id, "state", st, "deadline", tier.ProvisionDeadline())
			}
		}
	}
}

func (p *Placer) hostFailures(ctx context.Context, project string, dead map[string]bool) {
	for _, st := range []session.State{session.Provisioning, session.Running, session.Paused, session.Snapshotting, session.Stopping} {
		ids, err := p.Store.IDsInState(ctx, project, st, 100000)
		if err != nil {
			p.Logger.Error("placer: host failures", "project", project, "err", err)
			return
		}
		for _, id := range ids {
			sess, err := p.Store.Get(ctx, project, id)
			if err != nil || sess.State != st || !dead[sess.NodeID] {
				continue
			}
			if _, err := p.Store.Transition(ctx, store.Change{Project: project, ID: id, From: st, To: session.Failed,
				Driver: session.Placer, Reason: session.HostFailure, Version: sess.Version}); err != nil {
				var ce *store.ConflictError
				if !errors.As(err, &ce) {
					p.Logger.Error("placer: host failure", "session", id, "err", err)
				}
			}
		}
	}
}
