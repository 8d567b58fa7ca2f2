package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/templates"
	"wb/internal/netguard"
	"wb/internal/probe"
	"wb/session"
	"wb/snapstore"
	"wb/store"
)

// Config wires a Node.
type Config struct {
	Store     *store.Store
	Driver    hypervisor.Driver
	Templates templates.Catalog
	Info      store.NodeInfo // id, region, zone, address, capacity, tiers
	DataDir   string         // guests, snapshots and the journal
	AgentBin  string         // the static wb binary placed in every guest
	Tiers     session.Tiers
	// Runtime is the runtime decision point for guest events (nil: none).
	Runtime RuntimeChecker
	// Egress checks and dials every connection a guest's policy allows: the platform's deny
	// list, the operator's allow prefixes and the platform's own addresses, which the caller
	// keeps current (default: the deny list alone).
	Egress *netguard.Guard
	// Pools lists the warm pools to keep: a number of booted guests per (template, size class).
	Pools []Pool
	// PoolParallel is how many warm guests the node boots at a time (default: its CPUs).
	PoolParallel int
	// Snapshots is the object store every snapshot is uploaded to before it is reported
	// taken, and fetched from by a node that restores one it lacks (nil: snapshots stay in
	// DataDir/snapshots, restorable on this node only). SnapshotCacheBytes bounds what
	// DataDir/snapshots keeps of them then (default 8 GiB; the least recently used go first).
	Snapshots          *snapstore.Store
	SnapshotCacheBytes int64
	// Tick is the timer resolution (default 100 ms); Flush the usage flush period (default 4 s,
	// so that usage_to_date, settled within a second, is at most 5 s stale);
	// Heartbeat the registration refresh (default 2 s).
	Tick, Flush, Heartbeat time.Duration
	// RedisTimeout bounds every Redis call, so an outage never stalls the timers (default 2 s).
	RedisTimeout time.Duration
	// WriteStall is how long a write of an answer of a guest's agent through the node's API
	// (an exec's, a file's, a PTY's output) may wait on a caller that takes none of it before
	// the call ends, an exec's or a PTY's processes killed as its timeout kills them (default
	// DefaultWriteStall): a caller that stays connected and reads no more would hold the
	// call, and the agent's connection, for ever. It bounds as well each write to the guest's
	// agent through the node's API (a PTY's input, a request's body), which a hostile agent
	// may take none of.
	WriteStall time.Duration
	// ExecDrain is how long past its timeout and the node's grace an exec's answer may go on
	// while its caller is slow to read it (default DefaultExecDrain). The backstop counts the
	// agent's time only, and an agent whose answer has no end, read as slowly as it comes,
	// uses none: this is the bound of the exec's whole time.
	ExecDrain time.Duration
	// Metrics, when not nil, has the node's guests and the requests through its API counted
	// in it (see Metrics).
	Metrics *Metrics
	Logger  *slog.Logger
	Now     func() time.Time
}

// Pool is one warm pool's target.
type Pool struct {
	Template  string
	SizeClass string
	Size      int
	// Warm, when set, runs in each booted guest before it joins the pool (a desktop's display
	// and browser: desktop/guest.Start), so that what a claim would start is started already.
	// A guest whose warm-up fails is destroyed.
	Warm func(ctx context.Context, ex Execer) error
	// Runner, a runtime of the template (python3), makes this a pool for that runtime's
	// ephemeral runs: each guest starts the runtime's interpreter and leaves it waiting for a
	// run's code (see runnerFor), and only a run's session (session.RunMetadataKey) claims
	// one. A runtime without a runner here gets plain warm guests.
	Runner string
	// Max, above Size, lets the pool grow with the rate of claims asked of it, up to Max and
	// within the node's free capacity (see warmPool.target).
	Max int
}

// Execer runs one command in a guest and answers its output and exit code (a warm-up's
// commands; the same shape as desktop.Execer).
type Execer interface {
	Exec(ctx context.Context, argv []string, stdin []byte) (stdout, stderr []byte, exitCode int, err error)
}

// PoolReady answers how many warm guests of template and size class wait to be claimed
// (those of runner pools aside).
func (n *Node) PoolReady(template, sizeClass string) int {
	return n.RunnerPoolReady(template, sizeClass, "")
}

// RunnerPoolReady answers how many warm guests of template and size class with runtime's
// runner started wait to be claimed.
func (n *Node) RunnerPoolReady(template, sizeClass, runtime string) int {
	n.pool.mu.Lock()
	defer n.pool.mu.Unlock()
	return len(n.pool.ready[poolKey{template, sizeClass, runtime}])
}

// live is a guest the node runs for a session. mu guards g and serializes operations on it.
type live struct {
	mu     sync.Mutex
	fl     sync.Mutex // serializes flushes of g.Pending, which run without mu
	warned bool       // an outage was logged for this guest
	g      *guest
	agent  *agent.Client
	// direct is a direct guest's streams (a tier-1 run's warm guest whose init is its
	// runtime's loader, with no agent: agent.DirectGuest); agent is nil then.
	direct *agent.DirectGuest
	proxy  *httputil.ReverseProxy // to the agent, for the node's API
	egress *egressProxy           // the guest's way out
	seen   map[int]bool           // guest pids already reported as process_start
	cancel context.CancelFunc     // stops the event watcher
	// ending is the node's request that the guest's agent end its processes, while one is
	// in flight (endGuestProcs, relieveHostTasks).
	ending procEnd
	// noEnd is the guest whose agent cannot end its processes (agent.EndUnsupported): it is
	// not asked again.
	noEnd string
	// ooms is the count of OOM kills the node last read for guest oomGuest (see oomsBefore).
	ooms     int64
	oomGuest string
	// shown: a heartbeat written showed the guest's resources; claimGone: its placement's
	// claim is released (see heartbeat). Both under the node's mu.
	shown, claimGone bool
	// busySince is when the timers first found mu held, in a run of such ticks, and busyWith
	// the operation they last found holding it (the timers' goroutine alone uses both).
	busySince time.Time
	busyWith  string
	// stopSeen is when reconcile first found the session stopping in Redis while its guest
	// runs here, in a run of such looks (reconcile's goroutine alone uses it).
	stopSeen time.Time
	// holder names the operation that holds mu, for the timers' log (nil: one that does
	// not say; see lockFor).
	holder atomic.Pointer[string]
	// jseq numbers g's journal entries (under mu), and jnext is the newest taken (under jq,
	// never held across a write); jmu serializes the writes, and jwritten is the newest that
	// landed (see saveLater).
	jseq     uint64
	jq       sync.Mutex
	jnext    journalEntry
	jmu      sync.Mutex
	jwritten uint64
	// offered is the newest usage seq a flush has taken to send Redis (under mu): a record
	// above it Redis has never seen, so a sample may extend it rather than queue another
	// (mergeUsage). A recovered guest's records may all have been sent before the restart.
	offered int64
}

// Node runs guests for sessions. Safe for concurrent use.
type Node struct {
	Config
	journal journal
	mu      sync.Mutex
	guests  map[string]*live // by session id
	pool    *warmPool
	// wg counts the background work that Run waits for before it returns; only goBackground
	// adds to it. winding, under bgMu, is set once Run waits (windDown), and then no new work
	// starts: a WaitGroup's Add from zero may not race its Wait.
	wg      sync.WaitGroup
	bgMu    sync.Mutex
	winding bool
	// ctx outlives requests: background flushes and teardowns use it. Run cancels it on return.
	ctx    context.Context
	cancel context.CancelFunc
	// redisDown is set while Redis does not answer, so that replays back off.
	redisDown atomic.Bool
	// journalFailing is set while journal writes fail, so that a streak is logged once
	// (landJournal).
	journalFailing atomic.Bool
	// decisions counts the runtime decisions under way, those given up on included (decide).
	decisions atomic.Int64
	// quiesceAnswer and execGrace are the consts of those names (tests shorten them).
	quiesceAnswer, execGrace time.Duration
	// recovered is closed once Run has reloaded the journal's guests. Requests wait for it:
	// before, a guest may be published without its agent client, and a new guest could be
	// taken for an orphan and destroyed.
	recovered chan struct{}
	// snapshotsInUse counts, by snapshot id, the takes and restores using its directory,
	// which the cache's eviction leaves alone.
	snapshotsInUse inUse
	// hostTasks watches the host's guests' process total (watchHostTasks).
	hostTasks hostTasksWatch
}

// New prepares a node: its directories, and its journal from a previous run.
func New(cfg Config) (*Node, error) {
	if cfg.Store == nil || cfg.Driver == nil || len(cfg.Templates) == 0 || cfg.DataDir == "" {
		return nil, errors.New("node: Store, Driver, Templates and DataDir are required")
	}
	if cfg.Tick == 0 {
		cfg.Tick = 100 * time.Millisecond
	}
	if cfg.Flush == 0 {
		cfg.Flush = 4 * time.Second
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 2 * time.Second
	}
	if cfg.RedisTimeout == 0 {
		cfg.RedisTimeout = 2 * time.Second
	}
	if cfg.WriteStall <= 0 {
		cfg.WriteStall = DefaultWriteStall
	}
	if cfg.ExecDrain <= 0 {
		cfg.ExecDrain = DefaultExecDrain
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Egress == nil {
		g, err := netguard.New(netguard.Options{Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("node: egress guard: %w", err)
		}
		cfg.Egress = g
	}
	if cfg.SnapshotCacheBytes == 0 {
		cfg.SnapshotCacheBytes = 8 << 30
	}
	if cfg.Tiers == (session.Tiers{}) {
		cfg.Tiers = session.DefaultTiers()
	}
	for _, d := range []string{"journal", "guests", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(cfg.DataDir, d), 0o755); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	// A guest's sockets live under DataDir (the agent's, and the egress proxy's, which the node
	// listens on), named by the longest guest id, a session's; a Unix socket address holds at
	// most 107 bytes.
	if sock := filepath.Join(cfg.DataDir, "guests", session.NewID("sess_", time.Now()), "agent", "egress.sock"); len(sock) > 107 {
		return nil, fmt.Errorf("node: data dir %s is too long for the guests' Unix sockets: %s would be %d bytes, and at most 107 fit; use a shorter data dir",
			cfg.DataDir, sock, len(sock))
	}
	n := &Node{Config: cfg, journal: journal{dir: filepath.Join(cfg.DataDir, "journal")}, guests: map[string]*live{}, recovered: make(chan struct{}),
		quiesceAnswer: quiesceAnswer, execGrace: execGrace}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.pool = newWarmPool(n)
	if err := cfg.Metrics.watch(n); err != nil {
		return nil, err
	}
	return n, nil
}

// Run keeps the node going until ctx ends: it reloads guests from the journal, heartbeats,
// enforces timers, flushes usage, replays what Redis missed, and keeps the warm pools full.
// Guests keep running when Run returns, so a restarted node picks them up again.
func (n *Node) Run(ctx context.Context) error {
	defer n.cancel()
	stop := context.AfterFunc(ctx, n.cancel)
	defer stop()
	err := n.recover(n.ctx)
	close(n.recovered)
	if err != nil {
		return err
	}
	// Timers run alone on their own ticker: they never wait for Redis or for a teardown.
	// Heartbeats, usage flushes and replays have loops of their own.
	loops := []struct {
		every time.Duration
		do    func(context.Context)
	}{
		{n.Heartbeat, n.reconcile},
		{n.Flush, n.flushUsage},
		{n.Tick, n.replay},
	}
	registered := n.heartbeat(n.ctx)
	n.goBackground(func() { n.heartbeats(n.ctx, registered) })
	for _, lp := range loops {
		n.goBackground(func() {
			tick := time.NewTicker(lp.every)
			defer tick.Stop()
			for {
				select {
				case <-n.ctx.Done():
					return
				case <-tick.C:
					lp.do(n.ctx)
				}
			}
		})
	}
	n.goBackground(func() { n.pool.run(n.ctx) })
	tick := time.NewTicker(n.Tick)
	defer tick.Stop()
	for {
		select {
		case <-n.ctx.Done():
			n.windDown()
			return nil
		case <-tick.C:
			n.timers(n.ctx, n.Now())
			n.watchHostTasks()
		}
	}
}

// goBackground runs f beside its caller; Run waits for it before it returns. Once Run is
// winding down it starts nothing and answers false: the node's API still answers requests
// (a DELETE, a provision) while its server shuts down, and what such a request leaves undone
// (a teardown, a flush) is in the journal for the node's next start.
func (n *Node) goBackground(f func()) bool {
	n.bgMu.Lock()
	defer n.bgMu.Unlock()
	if n.winding {
		return false
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
	return true
}

// windDown waits for the background work, and from now on starts none (goBackground).
func (n *Node) windDown() {
	n.bgMu.Lock()
	n.winding = true
	n.bgMu.Unlock()
	n.wg.Wait()
}

// Close destroys the warm pool's guests (session guests are left to their sessions).
func (n *Node) Close(ctx context.Context) {
	n.pool.drain(ctx)
	n.removeCgroupParent()
}

// removeCgroupParent removes the driver's cgroup parent when the node runs no guest: each
// node's parent is its own, and one left behind by every node that ever ran here adds up
// (a cold make test left a hundred).
func (n *Node) removeCgroupParent() {
	c, ok := n.Driver.(hypervisor.CgroupOwner)
	if !ok {
		return
	}
	n.mu.Lock()
	left := len(n.guests)
	n.mu.Unlock()
	if left > 0 {
		return
	}
	if err := c.RemoveCgroupParent(); err != nil {
		n.Logger.Debug("cgroup parent left", "err", err)
	}
}

func (n *Node) redis(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, n.RedisTimeout)
}

// sessionUsage is what the sessions' guests hold.
func (n *Node) sessionUsage() (vcpu, mem int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range n.guests {
		vcpu += l.g.Resources.VCPU
		mem += l.g.Resources.MemoryMiB
	}
	return vcpu, mem
}

// heartbeat writes what the node's guests use, then releases the placement claims
// (store.ClaimOnNode) of the sessions an earlier heartbeat already showed: their resources
// are in the node's used figures now, and a claim left to lapse with its window (twice the
// heartbeat timeout, 14 s by default) counted each short session twice for that long, so that
// a node's whole capacity allowed only capacity ÷ window placements a second. A session's
// claim goes one heartbeat after the first that shows it, not with it: a placer that read the
// node's heartbeat just before then reads the claims still counts it (a session that ended
// needs neither: see releaseClaimOf). It reports whether the registration landed.
func (n *Node) heartbeat(ctx context.Context) bool {
	info := n.Info
	info.HeartbeatEvery = n.Heartbeat // its room lapses a few of these after (store.Heartbeat)
	if ri, ok := n.Driver.(hypervisor.RootImager); ok {
		info.Images = ri.RootImages() // new ones appear as templates are first started
	}
	// Each project's, for its share of the node, which the placers' claims check against it.
	info.Projects = map[string]store.NodeUse{}
	var fresh, shown []*live
	n.mu.Lock()
	for _, l := range n.guests {
		info.UsedVCPU += l.g.Resources.VCPU
		info.UsedMemoryMiB += l.g.Resources.MemoryMiB
		u := info.Projects[l.g.Project]
		u.VCPU += l.g.Resources.VCPU
		u.MemoryMiB += l.g.Resources.MemoryMiB
		info.Projects[l.g.Project] = u
		switch {
		case !l.shown:
			fresh = append(fresh, l)
		case !l.claimGone:
			shown = append(shown, l)
		}
	}
	n.mu.Unlock()
	pv, pm := n.pool.usage()
	info.UsedVCPU, info.UsedMemoryMiB = info.UsedVCPU+pv, info.UsedMemoryMiB+pm
	rctx, cancel := n.redis(ctx)
	defer cancel()
	if err := n.Store.Heartbeat(rctx, info); err != nil {
		if ctx.Err() == nil {
			n.Logger.Warn("node: heartbeat", "err", err)
		}
		return false
	}
	var claims []store.Claim
	n.mu.Lock()
	for _, l := range fresh {
		l.shown = true
	}
	for _, l := range shown {
		if !l.claimGone {
			l.claimGone = true
			claims = append(claims, claimOf(l))
		}
	}
	n.mu.Unlock()
	n.releaseClaims(rctx, claims...)
	return true
}

// heartbeats refreshes the registration every Heartbeat after one that landed (ok: the
// first, which Run made), and heartbeatRetry after one that failed: a node whose
// registration did not land (Redis slow or away at its start) would stay unknown to the
// placer for a whole interval, which an operator may have set long.
func (n *Node) heartbeats(ctx context.Context, ok bool) {
	for {
		wait := n.Heartbeat
		if !ok {
			wait = min(wait, heartbeatRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		ok = n.heartbeat(ctx)
	}
}

// heartbeatRetry is how soon a failed heartbeat is tried again.
const heartbeatRetry = 500 * time.Millisecond

// claimOf is the placement claim of l's session on this node, as the placer made it.
func claimOf(l *live) store.Claim {
	return store.Claim{Session: l.g.SessionID, VCPU: l.g.Resources.VCPU, MemoryMiB: l.g.Resources.MemoryMiB}
}

// releaseClaimOf releases the placement claim of l's session, which has ended on this node
// and left its guests, unless a heartbeat released it already: its resources are free, in
// every heartbeat from now on and in none of the claims. Called under n.mu; the release
// runs in the background.
func (n *Node) releaseClaimOf(l *live) {
	if l.claimGone {
		return
	}
	l.claimGone = true
	c := claimOf(l)
	n.goBackground(func() {
		rctx, cancel := n.redis(n.ctx)
		defer cancel()
		n.releaseClaims(rctx, c)
	})
}

// releaseClaims drops claims on this node; those it cannot drop lapse with their window.
func (n *Node) releaseClaims(ctx context.Context, claims ...store.Claim) {
	if err := n.Store.ReleaseOnNode(ctx, n.Info.ID, claims...); err != nil && ctx.Err() == nil {
		n.Logger.Debug("node: release placement claims", "claims", len(claims), "err", err)
	}
}

// waitRecovered returns once the node has reloaded its journal's guests (see Node.recovered),
// or with an error when ctx or the node ends first.
func (n *Node) waitRecovered(ctx context.Context) error {
	select {
	case <-n.recovered:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("node: still recovering its guests after a restart: %w", ctx.Err())
	case <-n.ctx.Done():
		return errors.New("node: shutting down")
	}
}

func (n *Node) lookup(id string) (*live, error) {
	if err := n.waitRecovered(n.ctx); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	l, ok := n.guests[id]
	if !ok {
		return nil, &NoGuestError{SessionID: id}
	}
	return l, nil
}

func (n *Node) all() []*live {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*live, 0, len(n.guests))
	for _, l := range n.guests {
		out = append(out, l)
	}
	return out
}

func (n *Node) guestDir(guestID string) string { return filepath.Join(n.DataDir, "guests", guestID) }

// spec is the hypervisor spec of a guest of tpl with res.
func (n *Node) spec(guestID string, tpl templates.Template, res session.Resources) hypervisor.Spec {
	dir := n.guestDir(guestID)
	args := []string{hypervisor.GuestAgentBin, "agent", "--socket", hypervisor.GuestAgentDir + "/agent.sock", "--root", hypervisor.GuestWorkspace}
	proxy := GuestProxy
	if r, ok := n.Driver.(hypervisor.EgressRelayer); ok {
		proxy = r.GuestProxy() // the driver relays from the guest's network to the socket
	} else {
		args = append(args, "--egress-listen", GuestProxy, "--egress-socket", hypervisor.GuestAgentDir+"/"+hypervisor.EgressSocket)
	}
	return hypervisor.Spec{
		ID: guestID, RootFS: tpl.RootFS, Writable: filepath.Join(dir, "writable"), AgentDir: filepath.Join(dir, "agent"),
		AgentBin: n.AgentBin, AgentSocket: "agent.sock",
		Args:          args,
		Env:           append(append([]string{}, tpl.Env...), egressEnv(proxy)...),
		ReadOnlyBinds: tpl.Binds,
		VCPU:          res.VCPU, MemoryMiB: res.MemoryMiB, DiskGiB: res.DiskGiB, Pids: 1024,
	}
}

// agentDial is how the node's agent proxy reaches guest guestID's agent: through the driver
// (a VM's agent, on vsock), else on the socket in the guest's agent dir.
func (n *Node) agentDial(guestID string) func(context.Context) (net.Conn, error) {
	if d, ok := n.Driver.(hypervisor.AgentDialer); ok {
		return func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, guestID) }
	}
	sock := filepath.Join(n.guestDir(guestID), "agent", "agent.sock")
	return func(ctx context.Context) (net.Conn, error) { return agent.DialSocket(ctx, sock) }
}

func (n *Node) agentFor(guestID string) *agent.Client {
	if d, ok := n.Driver.(hypervisor.AgentDialer); ok {
		return agent.NewDialClient(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, guestID) })
	}
	return agent.NewClient(filepath.Join(n.guestDir(guestID), "agent", "agent.sock"))
}

// waitHealthy polls the guest's agent until it answers or ctx ends (internal/probe: a
// probe's bound grows after one that ran out of time, so that a guest slow to answer on a
// loaded host is still heard).
func waitHealthy(ctx context.Context, c *agent.Client) error {
	if err := probe.Default().Until(ctx, nil, c.Health); err != nil {
		return fmt.Errorf("agent never answered: %w", err)
	}
	return nil
}

// template finds the template a session names (name@digest) and checks the digest.
func (n *Node) template(ref string) (templates.Template, error) {
	name, digest, _ := strings.Cut(ref, "@")
	tpl, ok := n.Templates[name]
	if !ok {
		return tpl, fmt.Errorf("node: no template %q here", name)
	}
	if digest != "" && digest != tpl.Digest {
		return tpl, fmt.Errorf("node: template %s is %s here, not %s", name, tpl.Digest, digest)
	}
	return tpl, nil
}

func randomID(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Catalog is the node's templates in the API's terms.
func (n *Node) Catalog() session.Catalog { return CatalogOf(n.Templates) }

// CatalogOf turns assembled templates into the API's catalog.
func CatalogOf(c templates.Catalog) session.Catalog {
	var out session.Catalog
	for _, name := range c.Names() {
		t := c[name]
		st := session.Template{Name: t.Name, Digest: t.Digest}
		for _, r := range t.Runtimes {
			st.Runtimes = append(st.Runtimes, session.Runtime{Name: r.Name, Argv: r.Argv, Version: r.Version})
		}
		out = append(out, st)
	}
	return out
}
