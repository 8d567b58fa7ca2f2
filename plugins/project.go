package plugins

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/logbudget"
	"wb/session"
	"wb/store"
)

// Plugin is one uploaded plugin of a project.
type Plugin struct {
	Name      string    `json:"name"`
	Digest    string    `json:"digest"` // sha256:HEX of the module
	Points    []string  `json:"points"`
	Order     int       `json:"order"` // plugins run by ascending order, then name
	FailOpen  bool      `json:"fail_open"`
	SizeBytes int       `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"` // of this version
	// Config is what the plugin reads with wb.config_get (PutOption WithConfig).
	Config map[string]string `json:"config,omitempty"`
}

// Limits are a project's overrides of the host's limits (its plan); zero fields take the
// host's Options.
type Limits struct {
	MemoryLimitPages uint32        `json:"memory_limit_pages,omitempty"` // 1–65536 pages of 64 KiB
	Timeout          time.Duration `json:"timeout,omitempty"`            // 1ms–MaxTimeout per decide call
}

// Option tunes Put and Call.
type Option func(*options)

type options struct {
	config map[string]string
	limits Limits
}

// WithConfig sets the plugin's configuration, which it reads with wb.config_get (sdk.Config):
// at most 64 keys of [A-Za-z0-9_.-]{1,64}, 256 KiB in all.
func WithConfig(cfg map[string]string) Option { return func(o *options) { o.config = cfg } }

// WithLimits sets the limits of a one-shot Call (the stored plugins of a project take the
// project's, see SetLimits).
func WithLimits(l Limits) Option { return func(o *options) { o.limits = l } }

var (
	nameRE      = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)
	configKeyRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

const (
	maxConfigKeys  = 64
	maxConfigBytes = 256 << 10
	maxOrder       = 1_000_000
)

// keys are the Redis keys of one project's plugins, as store/keys.go lays them out.
type keys struct {
	project string
	pk      store.PluginKeys
}

func projectKeys(project string) keys {
	return keys{project: project, pk: store.ProjectKeys(project).Plugins()}
}

func (k keys) meta() string              { return k.pk.Meta() }
func (k keys) limits() string            { return k.pk.Limits() }
func (k keys) ver() string               { return k.pk.Version() }
func (k keys) wasm(digest string) string { return k.pk.Wasm(digest) }

func checkProject(project string) error {
	if project == "" || len(project) > session.MaxIDLen || strings.ContainsAny(project, "{}") {
		return invalid("project id %q is not valid", project)
	}
	return nil
}

func (h *Host) needRedis() error {
	if h.rdb == nil {
		return errors.New("plugins: this host has no Redis")
	}
	return nil
}

// Put validates wasm and stores it as the project's plugin name (replacing any), for the
// points given, run at order among the project's plugins, failing open or closed. Calls
// already running finish on the old version; calls from now on use the new one, on this
// replica and on the gateways', which drop their copy of the set before Put returns
// (store.Changes, Forget); other replicas within Options.RefreshInterval. A project has at most
// Options.MaxPlugins plugins and MaxTotalBytes of modules: past them Put answers a
// *store.ConflictError saying so, and stores nothing.
func (h *Host) Put(ctx context.Context, project, name string, wasm []byte, points []string, order int, failOpen bool, opts ...Option) (Plugin, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if err := h.needRedis(); err != nil {
		return Plugin{}, err
	}
	if err := checkProject(project); err != nil {
		return Plugin{}, err
	}
	if !nameRE.MatchString(name) {
		return Plugin{}, invalid("name %q: use 1–64 of a-z, 0-9, _ and -", name)
	}
	pts, err := checkPoints(points)
	if err != nil {
		return Plugin{}, err
	}
	if order < -maxOrder || order > maxOrder {
		return Plugin{}, invalid("order %d: between -%d and %d", order, maxOrder, maxOrder)
	}
	if err := checkConfig(o.config); err != nil {
		return Plugin{}, err
	}
	lim, err := h.limits(ctx, project)
	if err != nil {
		return Plugin{}, err
	}
	digest, m, err := h.validate(ctx, wasm, lim.MemoryLimitPages, project, name)
	if err != nil {
		return Plugin{}, err
	}
	defer h.releaseModule(m) // held until the new set has its own reference

	p := Plugin{Name: name, Digest: digest, Points: pts, Order: order, FailOpen: failOpen, SizeBytes: len(wasm),
		CreatedAt: time.Now().UTC().Truncate(time.Millisecond), Config: o.config}
	b, err := json.Marshal(p)
	if err != nil {
		return Plugin{}, fmt.Errorf("plugins: encode %s: %w", name, err)
	}
	k := projectKeys(project)
	err = h.update(ctx, k, func(all map[string]Plugin, pipe redis.Pipeliner) error {
		if err := h.checkRoom(all, p); err != nil {
			return err
		}
		pipe.Set(ctx, k.wasm(digest), wasm, 0)
		pipe.HSet(ctx, k.meta(), name, b)
		if old, ok := all[name]; ok && old.Digest != digest && !usedElsewhere(all, name, old.Digest) {
			pipe.Del(ctx, k.wasm(old.Digest))
		}
		return nil
	})
	if err != nil {
		return Plugin{}, err
	}
	h.changes.Publish(ctx, project, store.ChangePlugins)
	s, err := h.reload(ctx, project)
	if err != nil {
		return Plugin{}, err
	}
	if e := s.entry(name); e != nil && e.pool != nil {
		if err := e.pool.warm(ctx, project, name); err != nil {
			h.log.Warn("plugin warm-up failed", "project", project, "plugin", name, "err", err)
		}
	}
	return p, nil
}

// Delete removes the project's plugin name, or answers ErrNotFound.
func (h *Host) Delete(ctx context.Context, project, name string) error {
	if err := h.needRedis(); err != nil {
		return err
	}
	if err := checkProject(project); err != nil {
		return err
	}
	k := projectKeys(project)
	found := false
	err := h.update(ctx, k, func(all map[string]Plugin, pipe redis.Pipeliner) error {
		old, ok := all[name]
		if found = ok; !ok {
			return nil
		}
		pipe.HDel(ctx, k.meta(), name)
		if !usedElsewhere(all, name, old.Digest) {
			pipe.Del(ctx, k.wasm(old.Digest))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !found {
		return ErrNotFound
	}
	h.changes.Publish(ctx, project, store.ChangePlugins)
	_, err = h.reload(ctx, project)
	return err
}

// List answers the project's plugins by order, then name.
func (h *Host) List(ctx context.Context, project string) ([]Plugin, error) {
	if err := h.needRedis(); err != nil {
		return nil, err
	}
	if err := checkProject(project); err != nil {
		return nil, err
	}
	raw, err := h.rdb.HGetAll(ctx, projectKeys(project).meta()).Result()
	if err != nil {
		return nil, fmt.Errorf("plugins: list %s: %w", project, err)
	}
	all := h.decodeAll(project, raw)
	out := make([]Plugin, 0, len(all))
	for _, p := range all {
		out = append(out, p)
	}
	sortPlugins(out)
	return out, nil
}

// Get answers one plugin, or ErrNotFound.
func (h *Host) Get(ctx context.Context, project, name string) (Plugin, error) {
	if err := h.needRedis(); err != nil {
		return Plugin{}, err
	}
	if err := checkProject(project); err != nil {
		return Plugin{}, err
	}
	b, err := h.rdb.HGet(ctx, projectKeys(project).meta(), name).Bytes()
	if errors.Is(err, redis.Nil) {
		return Plugin{}, ErrNotFound
	}
	if err != nil {
		return Plugin{}, fmt.Errorf("plugins: get %s/%s: %w", project, name, err)
	}
	var p Plugin
	if err := json.Unmarshal(b, &p); err != nil {
		return Plugin{}, fmt.Errorf("plugins: decode %s/%s: %w", project, name, err)
	}
	return p, nil
}

// SetLimits sets the project's limits (from its plan): the memory of each instance and the
// deadline of each call. Zero fields take the host's Options. Running calls keep the old
// limits; instances are started again under the new ones.
func (h *Host) SetLimits(ctx context.Context, project string, l Limits) error {
	if err := h.needRedis(); err != nil {
		return err
	}
	if err := checkProject(project); err != nil {
		return err
	}
	if l.MemoryLimitPages > maxPages {
		return invalid("memory limit of %d pages: at most %d", l.MemoryLimitPages, maxPages)
	}
	if l.Timeout < 0 || (l.Timeout > 0 && l.Timeout < time.Millisecond) || l.Timeout > MaxTimeout {
		return invalid("timeout %v: between 1ms and %v", l.Timeout, MaxTimeout)
	}
	k := projectKeys(project)
	_, err := h.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, k.limits(), "pages", l.MemoryLimitPages, "timeout_ms", l.Timeout.Milliseconds())
		p.Incr(ctx, k.ver())
		return nil
	})
	if err != nil {
		return fmt.Errorf("plugins: set limits of %s: %w", project, err)
	}
	h.changes.Publish(ctx, project, store.ChangePlugins)
	_, err = h.reload(ctx, project)
	return err
}

// limits answers the project's effective limits.
func (h *Host) limits(ctx context.Context, project string) (Limits, error) {
	raw, err := h.rdb.HGetAll(ctx, projectKeys(project).limits()).Result()
	if err != nil {
		return Limits{}, fmt.Errorf("plugins: limits of %s: %w", project, err)
	}
	return h.resolveLimits(raw), nil
}

func (h *Host) resolveLimits(raw map[string]string) Limits {
	l := Limits{MemoryLimitPages: h.o.MemoryLimitPages, Timeout: h.o.Timeout}
	if n, err := strconv.ParseUint(raw["pages"], 10, 32); err == nil && n > 0 && n <= maxPages {
		l.MemoryLimitPages = uint32(n)
	}
	if n, err := strconv.ParseInt(raw["timeout_ms"], 10, 64); err == nil && n > 0 && time.Duration(n)*time.Millisecond <= MaxTimeout {
		l.Timeout = time.Duration(n) * time.Millisecond
	}
	return l
}

func checkPoints(points []string) ([]string, error) {
	if len(points) == 0 {
		return nil, invalid("give at least one point (admission, runtime, spend)")
	}
	var out []string
	for _, p := range points {
		switch p {
		case session.PointAdmission, session.PointRuntime, session.PointSpend:
		default:
			return nil, invalid("unknown point %q (admission, runtime, spend)", p)
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

func checkConfig(cfg map[string]string) error {
	if len(cfg) > maxConfigKeys {
		return invalid("config has %d keys, at most %d", len(cfg), maxConfigKeys)
	}
	size := 0
	for k, v := range cfg {
		if !configKeyRE.MatchString(k) {
			return invalid("config key %q: use 1–64 of A-Z, a-z, 0-9, _, . and -", k)
		}
		size += len(k) + len(v)
	}
	if size > maxConfigBytes {
		return invalid("config is %d bytes, at most %d", size, maxConfigBytes)
	}
	return nil
}

func usedElsewhere(all map[string]Plugin, name, digest string) bool {
	for n, p := range all {
		if n != name && p.Digest == digest {
			return true
		}
	}
	return false
}

func sortPlugins(ps []Plugin) {
	slices.SortFunc(ps, func(a, b Plugin) int { return cmp.Or(cmp.Compare(a.Order, b.Order), strings.Compare(a.Name, b.Name)) })
}

func (h *Host) decodeAll(project string, raw map[string]string) map[string]Plugin {
	all := make(map[string]Plugin, len(raw))
	for name, b := range raw {
		var p Plugin
		if err := json.Unmarshal([]byte(b), &p); err != nil {
			h.log.Error("stored plugin is not valid JSON", "project", project, "plugin", name, "err", err)
			continue
		}
		all[name] = p
	}
	return all
}

// checkRoom refuses p when the project's plugins (all, read under update's WATCH) would then
// pass MaxPlugins or MaxTotalBytes; a new version of a plugin replaces the old one's room, and
// one that shrinks (or keeps) the modules' total is taken even past MaxTotalBytes.
func (h *Host) checkRoom(all map[string]Plugin, p Plugin) error {
	if _, replaces := all[p.Name]; !replaces && len(all) >= h.o.MaxPlugins {
		return &store.ConflictError{Message: fmt.Sprintf(
			"the project already has %d plugins, the most it may have; delete one (DELETE /v1/plugins/{name}) or put this module under an existing name", h.o.MaxPlugins)}
	}
	// By digest: a module shared by names is stored once.
	before, after := map[string]int{}, map[string]int{p.Digest: p.SizeBytes}
	for name, q := range all {
		before[q.Digest] = q.SizeBytes
		if name != p.Name {
			after[q.Digest] = q.SizeBytes
		}
	}
	sum := func(sizes map[string]int) (n int) {
		for _, b := range sizes {
			n += b
		}
		return n
	}
	// A put that does not grow the total passes even over the cap (a project that held more
	// before the cap was set or lowered): it can only bring the project closer to it.
	if total := sum(after); total > h.o.MaxTotalBytes && total > sum(before) {
		return &store.ConflictError{Message: fmt.Sprintf(
			"the project's plugins would hold %d bytes of plugin modules, and it may hold %d; delete one (DELETE /v1/plugins/{name}) or upload a smaller module", total, h.o.MaxTotalBytes)}
	}
	return nil
}

// update runs a change of the project's plugins as a transaction on the meta hash (WATCH), so
// that the module blobs are deleted only when no plugin refers to them any more, and that a
// put's check of the project's room (checkRoom) holds when it writes; and bumps the version.
// An error that change answers is answered as it is, and nothing is written.
func (h *Host) update(ctx context.Context, k keys, change func(all map[string]Plugin, pipe redis.Pipeliner) error) error {
	project := k.project
	for range 10 {
		err := h.rdb.Watch(ctx, func(tx *redis.Tx) error {
			raw, err := tx.HGetAll(ctx, k.meta()).Result()
			if err != nil {
				return err
			}
			all := h.decodeAll(project, raw)
			_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				if err := change(all, pipe); err != nil {
					return err
				}
				pipe.Incr(ctx, k.ver())
				return nil
			})
			return err
		}, k.meta())
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			return err
		}
		if err != nil {
			return fmt.Errorf("plugins: update %s: %w", project, err)
		}
		return nil
	}
	return fmt.Errorf("plugins: update %s: too much contention", project)
}

// The live plugin set of a project.

type project struct {
	id         string
	mu         sync.Mutex // serializes loads
	snap       atomic.Pointer[snapshot]
	checked    atomic.Int64 // Host.since at the last check against Redis
	refreshing atomic.Bool
	// gen counts Forgets: a set read before the latest one is not used, whenever its read
	// ends.
	gen atomic.Uint64
}

// Forget drops the project's loaded plugin set: another replica changed it (a gateway hears
// of it through store.Changes). The next decision reads it again, reusing the pools of the
// plugins that did not change.
func (h *Host) Forget(id string) {
	h.mu.Lock()
	pr := h.projects[id]
	h.mu.Unlock()
	if pr != nil {
		pr.gen.Add(1)
	}
}

// ForgetAll is Forget for every project.
func (h *Host) ForgetAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, pr := range h.projects {
		pr.gen.Add(1)
	}
}

type snapshot struct {
	gen     uint64 // the project's gen when its read began
	ver     int64
	limits  Limits
	byPoint map[string][]*entry
	pools   map[poolKey]*pool
	entries []*entry
}

// poolKey names a plugin's pool: one per plugin, even where plugins share a module (pool).
type poolKey struct {
	plugin string
	moduleKey
}

type entry struct {
	p       Plugin
	decider string // "plugin NAME"
	pool    *pool  // nil when loadErr
	loadErr string
}

func (s *snapshot) entry(name string) *entry {
	for _, e := range s.entries {
		if e.p.Name == name {
			return e
		}
	}
	return nil
}

func (h *Host) project(id string) (*project, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	pr, ok := h.projects[id]
	if !ok {
		pr = &project{id: id}
		h.projects[id] = pr
	}
	return pr, nil
}

// snapshot answers the project's current plugin set: loaded on first use, then checked against
// Redis in the background at most once per RefreshInterval.
func (h *Host) snapshot(ctx context.Context, id string) (*snapshot, error) {
	pr, err := h.project(id)
	if err != nil {
		return nil, err
	}
	if s := pr.snap.Load(); s != nil && s.gen == pr.gen.Load() {
		if h.now()-pr.checked.Load() >= int64(h.o.RefreshInterval) && pr.refreshing.CompareAndSwap(false, true) {
			h.mu.Lock()
			if h.closed {
				h.mu.Unlock()
				return s, nil
			}
			h.wg.Add(1)
			h.mu.Unlock()
			go h.refresh(pr, s.ver)
		}
		return s, nil
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if s := pr.snap.Load(); s != nil && s.gen == pr.gen.Load() {
		return s, nil
	}
	return h.load(ctx, pr)
}

// now is a monotonic clock in nanoseconds.
func (h *Host) now() int64 { return int64(time.Since(h.start)) }

func (h *Host) refresh(pr *project, ver int64) {
	defer h.wg.Done()
	defer pr.refreshing.Store(false)
	ctx, cancel := context.WithTimeout(h.bg, time.Minute)
	defer cancel()
	cur, err := h.rdb.Get(ctx, projectKeys(pr.id).ver()).Int64()
	if errors.Is(err, redis.Nil) {
		cur, err = 0, nil
	}
	if err != nil {
		h.log.Warn("plugin set check failed; keeping the current one", "project", pr.id, "err", err)
		pr.checked.Store(h.now())
		return
	}
	if cur == ver {
		pr.checked.Store(h.now())
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if _, err := h.load(ctx, pr); err != nil {
		h.log.Warn("plugin set reload failed; keeping the current one", "project", pr.id, "err", err)
		pr.checked.Store(h.now())
	}
}

// reload loads the project's set now (after a change through this host).
func (h *Host) reload(ctx context.Context, id string) (*snapshot, error) {
	pr, err := h.project(id)
	if err != nil {
		return nil, err
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return h.load(ctx, pr)
}

// load reads the project's set from Redis and publishes it, reusing the pools of unchanged
// plugins and retiring the others. The caller holds pr.mu.
func (h *Host) load(ctx context.Context, pr *project) (*snapshot, error) {
	if err := h.needRedis(); err != nil {
		return nil, err
	}
	k := projectKeys(pr.id)
	gen := pr.gen.Load()
	var ver *redis.StringCmd
	var meta, lim *redis.MapStringStringCmd
	_, err := h.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		ver = p.Get(ctx, k.ver())
		meta = p.HGetAll(ctx, k.meta())
		lim = p.HGetAll(ctx, k.limits())
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("plugins: load %s: %w", pr.id, err)
	}
	v, _ := ver.Int64()
	plugins := make([]Plugin, 0, len(meta.Val()))
	for _, p := range h.decodeAll(pr.id, meta.Val()) {
		plugins = append(plugins, p)
	}
	sortPlugins(plugins)

	old := pr.snap.Load()
	s := &snapshot{gen: gen, ver: v, limits: h.resolveLimits(lim.Val()), byPoint: map[string][]*entry{}, pools: map[poolKey]*pool{}}
	for _, p := range plugins {
		e := &entry{p: p, decider: "plugin " + p.Name}
		key := poolKey{p.Name, moduleKey{s.limits.MemoryLimitPages, p.Digest}}
		if old != nil {
			e.pool = old.pools[key]
		}
		if e.pool == nil {
			m, err := h.acquireModule(ctx, pr.id, key.pages, p.Digest, func(ctx context.Context) ([]byte, error) {
				return h.rdb.Get(ctx, k.wasm(p.Digest)).Bytes()
			})
			switch {
			case errors.Is(err, ErrClosed) || ctx.Err() != nil:
				h.dropPools(s.pools, old)
				return nil, cmp.Or(ctx.Err(), err)
			case err != nil:
				e.loadErr = "could not be loaded: " + err.Error()
				h.log.Error("plugin could not be loaded", "project", pr.id, "plugin", p.Name, "digest", p.Digest, "err", err)
			default:
				e.pool = h.newPool(m)
			}
		}
		if e.pool != nil {
			s.pools[key] = e.pool
		}
		s.entries = append(s.entries, e)
		for _, pt := range p.Points {
			s.byPoint[pt] = append(s.byPoint[pt], e)
		}
	}
	pr.snap.Store(s)
	pr.checked.Store(h.now())
	if old != nil {
		for key, pl := range old.pools {
			if s.pools[key] != pl {
				pl.retire()
			}
		}
	}
	return s, nil
}

// dropPools retires the pools made for a snapshot that is not published.
func (h *Host) dropPools(pools map[poolKey]*pool, old *snapshot) {
	for key, pl := range pools {
		if old == nil || old.pools[key] != pl {
			pl.retire()
		}
	}
}

// Decide runs the project's plugins of point, in order, on the JSON input (Input.Marshal), and
// answers one decision per plugin (none when the project has none). A plugin that fails gives
// a deny naming it and the cause, or, if it is fail-open, an allow with a warning. The error is
// for the host's own failures and the end of ctx.
func (h *Host) Decide(ctx context.Context, project, point string, input []byte) ([]session.Decision, error) {
	if _, err := checkPoints([]string{point}); err != nil {
		return nil, err
	}
	if err := checkProject(project); err != nil {
		return nil, err
	}
	s, err := h.snapshot(ctx, project)
	if err != nil {
		return nil, err
	}
	entries := s.byPoint[point]
	if len(entries) == 0 {
		return nil, nil
	}
	out := make([]session.Decision, 0, len(entries))
	for _, e := range entries {
		d, err := h.decideOne(ctx, project, s, e, input)
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (h *Host) decideOne(ctx context.Context, project string, s *snapshot, e *entry, input []byte) (session.Decision, error) {
	for range 3 {
		if e.pool == nil {
			return h.failed(project, e, &CallError{Kind: FailStart, Cause: e.loadErr}), nil
		}
		inst, err := e.pool.acquire(ctx, project, e.p.Name)
		if errors.Is(err, errRetired) {
			// Replaced between taking the set and this call: take the new version.
			pr, perr := h.project(project)
			if perr != nil {
				return session.Decision{}, perr
			}
			if s = pr.snap.Load(); s == nil {
				break
			}
			name := e.p.Name
			if e = s.entry(name); e == nil {
				return session.Decision{Allow: true, Decider: "plugin " + name, Warnings: []string{"plugin " + name + " was deleted during the call"}}, nil
			}
			continue
		}
		var ce *CallError
		if errors.As(err, &ce) {
			return h.failed(project, e, ce), nil
		}
		if err != nil {
			return session.Decision{}, err
		}
		st := &callState{h: h, project: project, plugin: e.p.Name, config: e.p.Config}
		d, err := h.invoke(ctx, inst, st, input, s.limits.Timeout)
		e.pool.release(inst, err)
		if errors.As(err, &ce) {
			return h.failed(project, e, ce), nil
		}
		if err != nil {
			return session.Decision{}, err
		}
		d.Decider = e.decider
		if !d.Allow && len(d.Reasons) == 0 {
			d.Reasons = []string{"denied by " + e.decider}
		}
		return d, nil
	}
	return session.Decision{}, fmt.Errorf("plugins: %s/%s kept being replaced", project, e.p.Name)
}

// failed turns a plugin's failure into its decision.
func (h *Host) failed(project string, e *entry, ce *CallError) session.Decision {
	// A plugin may fail at every decision its tenant's guests cause (thousands a second):
	// the project's lines for them keep to a budget, as its plugins' own do.
	ok, dropped := h.failLogs.Take(project, time.Now())
	if dropped > 0 {
		h.log.Warn("a project's plugins fail more often than the log's budget; lines of their failures were dropped", "project", project,
			"dropped", dropped, "budget", logbudget.Limits())
	}
	if ok {
		h.log.Warn("plugin failed", "project", project, "plugin", e.p.Name, "digest", e.p.Digest,
			"kind", string(ce.Kind), "cause", ce.Cause, "fail_open", e.p.FailOpen)
	}
	if e.p.FailOpen {
		return session.Decision{Allow: true, Decider: e.decider, Warnings: []string{e.decider + " failed open: " + ce.Cause}}
	}
	return session.Decision{Allow: false, Decider: e.decider, Reasons: []string{e.decider + ": " + ce.Cause}}
}

// Call runs wasm once on input, as `wb plugins test` does: validate, start an instance, one
// decide under the deadline, close. It answers the decision, how long decide took, and a
// *ValidationError or a *CallError when the module is invalid or failed.
func (h *Host) Call(ctx context.Context, wasm []byte, input []byte, opts ...Option) (session.Decision, time.Duration, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if err := checkConfig(o.config); err != nil {
		return session.Decision{}, 0, err
	}
	lim := Limits{MemoryLimitPages: cmp.Or(o.limits.MemoryLimitPages, h.o.MemoryLimitPages), Timeout: cmp.Or(o.limits.Timeout, h.o.Timeout)}
	if lim.MemoryLimitPages > maxPages || lim.Timeout > MaxTimeout {
		return session.Decision{}, 0, invalid("limits %+v: at most %d pages and %v", o.limits, maxPages, MaxTimeout)
	}
	_, m, err := h.validate(ctx, wasm, lim.MemoryLimitPages, "", "test")
	if err != nil {
		return session.Decision{}, 0, err
	}
	defer h.releaseModule(m)
	inst, err := h.newInstance(ctx, m, "", "test")
	if err != nil {
		return session.Decision{}, 0, err
	}
	defer inst.close()
	start := time.Now()
	d, err := h.invoke(ctx, inst, &callState{h: h, plugin: "test", config: o.config}, input, lim.Timeout)
	took := time.Since(start)
	if err != nil {
		return session.Decision{}, took, err
	}
	d.Decider = "plugin test"
	if !d.Allow && len(d.Reasons) == 0 {
		d.Reasons = []string{"denied by plugin test"}
	}
	return d, took, nil
}
