package policies

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"wb/internal/logbudget"
	"wb/store"
)

// shippedFS holds the platform's Rego and its tests (*_test.rego, run by the tests and by
// `opa test policies/`).
//
//go:embed *.rego
var shippedFS embed.FS

// Options configure an Engine. Zero values take the defaults.
type Options struct {
	Logger      *slog.Logger
	DecisionLog DecisionLogOptions
	// Metrics registers wb_policy_decision_log_dropped_total when set.
	Metrics prometheus.Registerer
	// Refresh is how stale a project's set of latest policies may get before it is re-read
	// from Redis (Puts on this engine apply at once). Default 1 s.
	Refresh time.Duration
	// EvalTimeout bounds the project policies of one decision, in wall time; a project
	// policy that runs out of it fails closed (an enforced deny or kill). Default 250 ms.
	EvalTimeout time.Duration
	// EvalMemory bounds what the builtins of one policy evaluation may make (strings,
	// arrays, sets, objects), in bytes; an evaluation that would go over fails, closed.
	// Default 32 MiB.
	EvalMemory int64
	// MaxProjectEvals bounds the decisions that evaluate one project's policies at once on
	// this engine (each may use EvalMemory); more wait for a slot within EvalTimeout, then
	// fail closed. Default 4.
	MaxProjectEvals int
	// CacheSize bounds the prepared revisions kept in memory (pinned and latest). Default 4096.
	CacheSize int
	// MaxPolicies caps each project's policy names (default DefaultMaxPolicies).
	MaxPolicies int
	// MaxVersions is how many of each policy's newest versions are kept, besides those a
	// live session pinned (default DefaultMaxVersions).
	MaxVersions int
	// PinWindow is how long Put keeps a version that an admission named (Pin) after the
	// fact, so that a session is written with a version that still exists; by then the live
	// session pins it (default DefaultPinWindow).
	PinWindow time.Duration
}

// DecisionLogOptions configure the asynchronous decision log.
type DecisionLogOptions struct {
	// Buffer is the number of decisions queued for writing; beyond it they are dropped and
	// counted. Default 4096.
	Buffer int
	// MaxLen caps each project's stream (XADD MAXLEN ~). Default 10000.
	MaxLen int64
}

// Engine evaluates the shipped Rego and the projects' policies at the three decision points.
// It is safe for concurrent use.
type Engine struct {
	rdb          redis.UniversalClient
	log          *slog.Logger
	caps         *ast.Capabilities
	refresh      time.Duration
	evalTimeout  time.Duration
	evalMemory   int64
	evalSlots    int
	slots        sync.Map         // project → chan struct{}: its decisions evaluating its policies
	failLogs     logbudget.Budget // each project's lines for its policies' failures (warnFailed)
	putScript    *redis.Script
	pinScript    *redis.Script
	deleteScript *redis.Script
	maxPolicies  int
	maxVersions  int
	pinWindow    time.Duration
	maxRetired   int // maxRetiredNames; tests lower it
	// pins reads the policy versions the project's live sessions pinned, which Put keeps.
	pins *store.Store

	shipped map[string]*policy // by point
	// runtimeMemo keeps the shipped runtime policy's documents (it is deterministic).
	runtimeMemo docMemo
	projects    sync.Map // project → *projectState
	cache       *preparedCache
	loads       singleflight.Group

	dlog *decisionLog
	// changes announces a Put to every gateway, and each drops its copy (Forget).
	changes *store.Changes
}

// policy is one evaluable revision: a shipped module (ID "platform") or a project's version.
type policy struct {
	Version
	*compiled       // nil when err is set
	err       error // a stored revision that no longer compiles
	// checked is when (Unix ns) its stored record was last read (or a read tried): pinned
	// serves it from the cache until Options.Refresh after, then reads the record again.
	checked atomic.Int64
}

// newPolicy answers a revision whose stored record was read (or written) just now.
func newPolicy(v Version, c *compiled, err error) *policy {
	p := &policy{Version: v, compiled: c, err: err}
	p.checked.Store(time.Now().UnixNano())
	return p
}

func (p *policy) decider() string {
	if p.ID == shippedID {
		return shippedID
	}
	return "policy " + p.ID
}

const shippedID = "platform"

// New compiles the shipped policies and starts the decision log's writer. Close stops it.
func New(ctx context.Context, rdb redis.UniversalClient, o Options) (*Engine, error) {
	if rdb == nil {
		return nil, errors.New("policies: a Redis client is required")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Refresh <= 0 {
		o.Refresh = time.Second
	}
	if o.EvalTimeout <= 0 {
		o.EvalTimeout = 250 * time.Millisecond
	}
	if o.CacheSize <= 0 {
		o.CacheSize = 4096
	}
	if o.EvalMemory <= 0 {
		o.EvalMemory = defaultEvalMemory
	}
	if o.MaxProjectEvals <= 0 {
		o.MaxProjectEvals = 4
	}
	if o.MaxPolicies <= 0 {
		o.MaxPolicies = DefaultMaxPolicies
	}
	if o.MaxVersions <= 0 {
		o.MaxVersions = DefaultMaxVersions
	}
	if o.PinWindow <= 0 {
		o.PinWindow = DefaultPinWindow
	}
	e := &Engine{
		rdb: rdb, log: o.Logger, caps: capabilities(), refresh: o.Refresh, evalTimeout: o.EvalTimeout, evalMemory: o.EvalMemory, evalSlots: o.MaxProjectEvals,
		putScript: redis.NewScript(putScript), pinScript: redis.NewScript(pinScript), deleteScript: redis.NewScript(deleteScript),
		maxPolicies: o.MaxPolicies, maxVersions: o.MaxVersions, pinWindow: o.PinWindow, maxRetired: maxRetiredNames, pins: store.New(rdb),
		shipped: map[string]*policy{},
		cache:   &preparedCache{max: o.CacheSize, m: map[string]*policy{}},
	}
	files, err := fs.Glob(shippedFS, "*.rego")
	if err != nil {
		return nil, fmt.Errorf("policies: shipped: %w", err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		src, err := shippedFS.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("policies: shipped %s: %w", f, err)
		}
		c, err := compile(ctx, e.caps, f, string(src))
		if err != nil {
			return nil, fmt.Errorf("policies: shipped %s: %w", f, err)
		}
		e.shipped[c.point] = &policy{compiled: c, Version: Version{
			ID: shippedID, Name: strings.TrimSuffix(f, ".rego"), Mode: ModeEnforce, Point: c.point,
			Digest: digest(string(src)), Masked: c.masked,
		}}
	}
	for _, pt := range []string{PointAdmission, PointRuntime, PointSpend} {
		if e.shipped[pt] == nil {
			return nil, fmt.Errorf("policies: no shipped policy for %s", pt)
		}
	}
	dl, err := newDecisionLog(rdb, o.Logger, o.DecisionLog, o.Metrics)
	if err != nil {
		return nil, err
	}
	e.dlog = dl
	e.changes = store.NewChanges(rdb, o.Logger)
	return e, nil
}

// Close stops the decision log after writing what it holds, or when ctx ends. Decisions
// made after Close are still answered; their log entries are dropped and counted.
func (e *Engine) Close(ctx context.Context) error { return e.dlog.close(ctx) }

// Dropped answers how many decision-log entries were dropped because the buffer was full.
func (e *Engine) Dropped() uint64 { return e.dlog.dropped.Load() }

// Shipped answers the source of the platform's policy at a point, for display.
func (e *Engine) Shipped(point string) (Version, string, error) {
	p := e.shipped[point]
	if p == nil {
		return Version{}, "", fmt.Errorf("%w: point %q", ErrNotFound, point)
	}
	src, err := shippedFS.ReadFile(p.Name + ".rego")
	if err != nil {
		return Version{}, "", fmt.Errorf("policies: shipped %s: %w", p.Name, err)
	}
	return p.Version, string(src), nil
}

// preparedCache keeps prepared revisions by (project, id). Revisions are immutable, so an
// entry never goes stale; beyond max, arbitrary entries are evicted.
type preparedCache struct {
	mu  sync.RWMutex
	max int
	m   map[string]*policy
}

func cacheKey(project, id string) string { return project + "\x00" + id }

func (c *preparedCache) get(project, id string) *policy {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.m[cacheKey(project, id)]
}

func (c *preparedCache) put(project string, p *policy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if len(c.m) < c.max {
			break
		}
		delete(c.m, k)
	}
	c.m[cacheKey(project, p.ID)] = p
}

// policySet is an immutable snapshot of a project's latest policies. A decision loads one
// snapshot and evaluates it to the end, so a swap never mixes revisions within a decision.
type policySet struct {
	byName  map[string]*policy
	byPoint map[string][]*policy // sorted by name
	loaded  time.Time
	gen     uint64 // the project's generation when its read began (projectState.gen)
}

func newPolicySet(ps []*policy, loaded time.Time, gen uint64) *policySet {
	s := &policySet{byName: map[string]*policy{}, byPoint: map[string][]*policy{}, loaded: loaded, gen: gen}
	slices.SortFunc(ps, func(a, b *policy) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range ps {
		s.byName[p.Name] = p
		s.byPoint[p.Point] = append(s.byPoint[p.Point], p)
	}
	return s
}

func (s *policySet) all() []*policy {
	out := make([]*policy, 0, len(s.byName))
	for _, p := range s.byName {
		out = append(out, p)
	}
	return out
}

// with answers a copy of s where p replaces an older version of its name.
func (s *policySet) with(p *policy) *policySet {
	if cur := s.byName[p.Name]; cur != nil && cur.Version.Version >= p.Version.Version {
		return s
	}
	ps := s.all()
	ps = slices.DeleteFunc(ps, func(q *policy) bool { return q.Name == p.Name })
	return newPolicySet(append(ps, p), s.loaded, s.gen)
}

type projectState struct {
	mu  sync.Mutex // serialises loads and swaps
	cur atomic.Pointer[policySet]
	// gen counts Forgets: a set read before the latest one is not used, and a read that
	// began before it does not pass for fresh whenever it ends.
	gen atomic.Uint64
}

// Forget drops the project's loaded policies: another engine stored a version (a gateway
// hears of it through store.Changes). The next decision reads them again.
func (e *Engine) Forget(project string) {
	if st, ok := e.projects.Load(project); ok {
		st.(*projectState).gen.Add(1)
	}
}

// ForgetAll is Forget for every project.
func (e *Engine) ForgetAll() {
	e.projects.Range(func(_, st any) bool {
		st.(*projectState).gen.Add(1)
		return true
	})
}

func (e *Engine) state(project string) *projectState {
	if st, ok := e.projects.Load(project); ok {
		return st.(*projectState)
	}
	st, _ := e.projects.LoadOrStore(project, &projectState{})
	return st.(*projectState)
}

// publish swaps p into the project's latest set, if the set is loaded.
func (e *Engine) publish(project string, p *policy) {
	st := e.state(project)
	st.mu.Lock()
	defer st.mu.Unlock()
	if cur := st.cur.Load(); cur != nil {
		st.cur.Store(cur.with(p))
	}
}

// policySet answers the project's latest policies, re-reading Redis when the snapshot is
// older than Options.Refresh. While one caller refreshes, the others keep the old snapshot.
func (e *Engine) policySet(ctx context.Context, project string) (*policySet, error) {
	if err := validProject(project); err != nil {
		return nil, err
	}
	st := e.state(project)
	fresh := func(s *policySet) bool {
		return s != nil && s.gen == st.gen.Load() && time.Since(s.loaded) < e.refresh
	}
	cur := st.cur.Load()
	if fresh(cur) {
		return cur, nil
	}
	if cur != nil && cur.gen == st.gen.Load() {
		// Only old: one caller reads it again while the others keep it. A forgotten set is
		// waited for instead: its project changed.
		if !st.mu.TryLock() {
			return cur, nil
		}
	} else {
		st.mu.Lock()
	}
	defer st.mu.Unlock()
	if now := st.cur.Load(); fresh(now) {
		return now, nil
	}
	gen := st.gen.Load()
	cur = st.cur.Load()
	next, err := e.load(ctx, project, cur, gen)
	if err != nil {
		if cur == nil {
			return nil, err
		}
		e.log.WarnContext(ctx, "policies: refresh failed; keeping the loaded policies", "project", project, "err", err)
		next = newPolicySet(cur.all(), time.Now(), gen)
	}
	st.cur.Store(next)
	return next, nil
}

// load reads the project's latest versions and prepares those not already prepared; gen is
// the project's generation before the read.
func (e *Engine) load(ctx context.Context, project string, cur *policySet, gen uint64) (*policySet, error) {
	loaded := time.Now()
	recs, err := e.latest(ctx, project)
	if err != nil {
		return nil, err
	}
	ps := make([]*policy, 0, len(recs))
	for _, r := range recs {
		if cur != nil {
			// Redis is never behind a version this engine published; the same number with
			// another digest (a Redis restored or failed over) is prepared again.
			if p := cur.byName[r.version.Name]; p != nil && (p.Version.Version > r.version.Version ||
				p.Version.Version == r.version.Version && p.Digest == r.version.Digest) {
				ps = append(ps, p)
				continue
			}
		}
		ps = append(ps, e.prepare(ctx, project, r))
	}
	// A name Redis no longer has was deleted (Delete): it is not carried over from cur. No
	// version published here can be missing from the read: Put writes Redis before it
	// publishes, and publish waits for st.mu, which a load holds.
	return newPolicySet(ps, loaded, gen), nil
}

// prepare answers the cached prepared revision, or compiles the stored source: a cached
// revision whose digest is not the stored one (a Redis restored or failed over) is compiled
// again.
func (e *Engine) prepare(ctx context.Context, project string, r stored) *policy {
	if p := e.cache.get(project, r.version.ID); p != nil && p.Digest == r.version.Digest {
		p.checked.Store(time.Now().UnixNano())
		return p
	}
	v, _, _ := e.loads.Do(cacheKey(project, r.version.ID), func() (any, error) {
		// Shared by every caller waiting on this key, and cached: not cut short by the
		// first caller's cancellation.
		ctx := context.WithoutCancel(ctx)
		p := newPolicy(r.version, nil, nil)
		p.compiled, p.err = compile(ctx, e.caps, r.version.Name+".rego", r.source)
		if p.err != nil {
			e.log.ErrorContext(ctx, "policies: stored policy does not compile", "project", project, "policy", r.version.ID, "err", p.err)
			p.compiled = nil
		} else if p.point != r.version.Point {
			p.compiled, p.err = nil, fmt.Errorf("policy %s now compiles for point %s, stored as %s", r.version.ID, p.point, r.version.Point)
		}
		e.cache.put(project, p)
		return p, nil
	})
	return v.(*policy)
}

// pinned answers the exact revision id of the project's policy. A cached revision is served
// for Options.Refresh after its stored record was last read, as the latest ones are (a runtime
// decision, for every event of a session, reads no Redis); then the record is read again and
// prepare checks its digest. While Redis cannot answer, the cached revision is kept.
func (e *Engine) pinned(ctx context.Context, project, id string) (*policy, error) {
	name, n, err := ParseID(id)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: policy id %q must pin a version (pol_NAME@N)", ErrInvalid, id)
	}
	cached := e.cache.get(project, FormatID(name, n))
	if cached != nil && time.Since(time.Unix(0, cached.checked.Load())) < e.refresh {
		return cached, nil
	}
	rec, n, err := e.fetch(ctx, project, name, n)
	if err != nil {
		if cached == nil || errors.Is(err, ErrNotFound) {
			return nil, err
		}
		e.log.WarnContext(ctx, "policies: pinned policy check failed; keeping the cached one", "project", project, "policy", cached.ID, "err", err)
		cached.checked.Store(time.Now().UnixNano()) // tried: not again before Options.Refresh
		return cached, nil
	}
	return e.prepare(ctx, project, stored{version: rec.version(name, n), source: rec.Source}), nil
}
