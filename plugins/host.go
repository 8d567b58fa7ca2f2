package plugins

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"wb/internal/logbudget"
	"wb/store"
)

// Defaults of Options.
const (
	DefaultMemoryLimitPages = 256 // 16 MiB
	DefaultTimeout          = 20 * time.Millisecond
	DefaultPoolSize         = 4
	DefaultMaxOutputBytes   = 64 << 10
	DefaultInitTimeout      = time.Second
	DefaultRefreshInterval  = time.Second
	// DefaultMaxPlugins bounds a project's plugins: a decision runs every plugin of its point
	// in order, and every gateway compiles and pools each of them, so more than a handful is
	// never sensible and a thousand would fill Redis and every gateway's memory.
	DefaultMaxPlugins = 16
	// DefaultMaxCacheBytes bounds the compilation cache on disk (Options.CacheDir).
	DefaultMaxCacheBytes = 2 << 30
	// DefaultMaxTotalBytes bounds a project's modules together (each one is at most the
	// gateway's 10 MiB upload): every gateway compiles them all, at several times their size.
	DefaultMaxTotalBytes = 32 << 20

	// MaxTimeout bounds a project's per-call timeout (SetLimits).
	MaxTimeout = 10 * time.Second
	// maxPages is the most a Wasm 32-bit memory can have (4 GiB).
	maxPages = 65536
)

// Options configure a Host. Zero values take the defaults.
type Options struct {
	// MemoryLimitPages caps each instance's linear memory, in 64 KiB pages (default 256 =
	// 16 MiB). SetLimits overrides it per project.
	MemoryLimitPages uint32
	// Timeout is the deadline of one decide call (default 20ms). SetLimits overrides it per
	// project.
	Timeout time.Duration
	// PoolSize bounds the instances of one plugin of a project (default 4); a call waits, under
	// its context, while all are busy.
	PoolSize int
	// MaxOutputBytes bounds a result (default 64 KiB).
	MaxOutputBytes int
	// CacheDir, when set, keeps compiled code on disk across restarts (wazero's compilation
	// cache); compiled code is shared in memory across the host's runtimes either way.
	CacheDir string
	// MaxCacheBytes bounds the files in CacheDir, checked when the host starts: wazero never
	// removes any, so the oldest are removed until the rest fit (default DefaultMaxCacheBytes).
	// It is only a cache: a module whose code was removed is compiled again.
	MaxCacheBytes int64
	// Logger receives the host's and the plugins' logs (default slog.Default()).
	Logger *slog.Logger
	// InitTimeout is the deadline for starting an instance (its _initialize; default 1s).
	InitTimeout time.Duration
	// RefreshInterval is how often a project's plugin set is checked against Redis for changes
	// made through other replicas (default 1s).
	RefreshInterval time.Duration
	// MaxPlugins caps each project's plugins (default DefaultMaxPlugins).
	MaxPlugins int
	// MaxTotalBytes caps the bytes of each project's modules, a module that several plugins
	// share counted once (default DefaultMaxTotalBytes).
	MaxTotalBytes int
}

func (o *Options) defaults() error {
	if o.MemoryLimitPages == 0 {
		o.MemoryLimitPages = DefaultMemoryLimitPages
	}
	if o.MemoryLimitPages > maxPages {
		return fmt.Errorf("plugins: MemoryLimitPages %d is more than %d", o.MemoryLimitPages, maxPages)
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.PoolSize <= 0 {
		o.PoolSize = DefaultPoolSize
	}
	if o.MaxOutputBytes <= 0 {
		o.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.InitTimeout <= 0 {
		o.InitTimeout = DefaultInitTimeout
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = DefaultRefreshInterval
	}
	if o.MaxPlugins <= 0 {
		o.MaxPlugins = DefaultMaxPlugins
	}
	if o.MaxTotalBytes <= 0 {
		o.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if o.MaxCacheBytes <= 0 {
		o.MaxCacheBytes = DefaultMaxCacheBytes
	}
	return nil
}

// Host runs the projects' plugins. It is safe for concurrent use.
type Host struct {
	rdb   redis.UniversalClient
	o     Options
	log   *slog.Logger
	cache wazero.CompilationCache

	start time.Time // for a monotonic clock

	bg   context.Context // ends at Close: background refreshes
	stop context.CancelFunc
	wg   sync.WaitGroup

	// compiles admits compiles: a few at once, one a project (compiles.go).
	compiles *compileSlots

	// logs is each project's budget of wb.log lines, failLogs of the host's lines for its
	// plugins' failed calls.
	logs, failLogs logbudget.Budget

	mu       sync.Mutex
	closed   bool
	runtimes map[uint32]wazero.Runtime // by memory limit in pages
	modules  map[moduleKey]*module
	projects map[string]*project

	// changes announces Put, Delete and SetLimits to every gateway, and each drops its copy
	// of the project's set (Forget). nil without Redis.
	changes *store.Changes
}

// NewHost makes a host. rdb may be nil for a host that only validates and runs one-shot calls
// (Validate, Call).
func NewHost(ctx context.Context, rdb redis.UniversalClient, o Options) (*Host, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	cache := wazero.NewCompilationCache()
	if o.CacheDir != "" {
		trimCache(o.CacheDir, o.MaxCacheBytes, o.Logger)
		var err error
		if cache, err = wazero.NewCompilationCacheWithDir(o.CacheDir); err != nil {
			return nil, fmt.Errorf("plugins: compilation cache %s: %w", o.CacheDir, err)
		}
	}
	h := &Host{rdb: rdb, o: o, log: o.Logger, cache: cache, start: time.Now(), compiles: newCompileSlots(),
		runtimes: map[uint32]wazero.Runtime{}, modules: map[moduleKey]*module{}, projects: map[string]*project{}}
	if rdb != nil {
		h.changes = store.NewChanges(rdb, o.Logger)
	}
	h.bg, h.stop = context.WithCancel(context.WithoutCancel(ctx))
	// The default runtime, now, so that a broken setup fails here.
	if _, err := h.runtime(ctx, o.MemoryLimitPages); err != nil {
		h.stop()
		_ = cache.Close(ctx)
		return nil, err
	}
	return h, nil
}

// Close stops the host: it closes every instance, compiled module and runtime. Calls running
// at that moment fail.
func (h *Host) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	rts := h.runtimes
	h.runtimes, h.modules, h.projects = nil, nil, nil
	h.mu.Unlock()
	h.stop()
	h.wg.Wait()
	var errs []error
	for _, r := range rts {
		errs = append(errs, r.Close(ctx))
	}
	errs = append(errs, h.cache.Close(ctx))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("plugins: close: %w", err)
	}
	return nil
}

// runtime answers the runtime for a memory limit, making it on first use: wasi_snapshot_preview1
// and the wb module instantiated in it.
func (h *Host) runtime(ctx context.Context, pages uint32) (wazero.Runtime, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if r, ok := h.runtimes[pages]; ok {
		return r, nil
	}
	cfg := wazero.NewRuntimeConfig().
		WithCloseOnContextDone(true).
		WithMemoryLimitPages(pages).
		WithCompilationCache(h.cache).
		WithDebugInfoEnabled(false)
	r := wazero.NewRuntimeWithConfig(ctx, cfg)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r); err != nil {
		_ = r.Close(ctx)
		return nil, fmt.Errorf("plugins: instantiate WASI: %w", err)
	}
	_, err := r.NewHostModuleBuilder(ModuleWB).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(h.hostLog), []api.ValueType{i32, i32, i32}, nil).
		WithParameterNames("level", "ptr", "len").Export("log").
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostConfigGet), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}).
		WithParameterNames("key_ptr", "key_len", "out_ptr", "out_cap").Export("config_get").
		Instantiate(ctx)
	if err != nil {
		_ = r.Close(ctx)
		return nil, fmt.Errorf("plugins: instantiate the wb module: %w", err)
	}
	h.runtimes[pages] = r
	return r, nil
}

// Compiled modules, shared by every pool (and one-shot call) of one (memory limit, digest).

type moduleKey struct {
	pages  uint32
	digest string
}

type module struct {
	key   moduleKey
	ready chan struct{} // closed when cm or err is set
	cm    wazero.CompiledModule
	rt    wazero.Runtime
	err   error
	refs  int // guarded by Host.mu
	// cached are the files its compile added to Options.CacheDir, removed if Validate refuses
	// the module after compiling it (dropCached).
	cached []string
}

// acquireModule answers the compiled module of digest for a memory limit, compiling it (the
// bytes from fetch) for project if no one has. Release it with releaseModule.
func (h *Host) acquireModule(ctx context.Context, project string, pages uint32, digest string, fetch func(context.Context) ([]byte, error)) (*module, error) {
	rt, err := h.runtime(ctx, pages)
	if err != nil {
		return nil, err
	}
	key := moduleKey{pages, digest}
	for {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return nil, ErrClosed
		}
		m, ok := h.modules[key]
		if !ok {
			m = &module{key: key, ready: make(chan struct{}), rt: rt, refs: 1}
			h.modules[key] = m
			h.mu.Unlock()
			return h.compile(ctx, project, m, fetch)
		}
		m.refs++
		h.mu.Unlock()
		select {
		case <-m.ready:
		case <-ctx.Done():
			h.releaseModule(m)
			return nil, ctx.Err()
		}
		if m.err == nil {
			return m, nil
		}
		h.releaseModule(m)
		// The compiler's context ended (while it waited for its turn, say): ours has not, so
		// we compile it ourselves rather than fail with its error.
		if !isContextErr(m.err) || ctx.Err() != nil {
			return nil, m.err
		}
	}
}

// compile fetches and compiles m for project, in one of the host's compile slots (waiting
// under ctx for its turn: compiles.go), and makes it ready.
func (h *Host) compile(ctx context.Context, project string, m *module, fetch func(context.Context) ([]byte, error)) (*module, error) {
	wasm, err := fetch(ctx)
	if err == nil && Digest(wasm) != m.key.digest {
		err = fmt.Errorf("stored module does not match its digest %s", m.key.digest)
	}
	if err == nil {
		// Validate checked an upload's shape; this checks a stored module too, which an older
		// version of the host may have let in.
		err = checkShape(wasm)
	}
	if err == nil {
		wasm, err = boundTables(wasm)
	}
	if err == nil {
		wasm, err = boundStack(wasm)
	}
	if err == nil {
		if err = h.compiles.acquire(ctx, project); err == nil {
			var before map[string]bool
			if h.o.CacheDir != "" {
				before = cacheFiles(h.o.CacheDir)
			}
			start := time.Now()
			m.cm, err = m.rt.CompileModule(ctx, wasm)
			if err == nil {
				h.log.Debug("plugin compiled", "digest", m.key.digest, "pages", m.key.pages, "took", time.Since(start))
				if before != nil {
					for f := range cacheFiles(h.o.CacheDir) {
						if !before[f] {
							m.cached = append(m.cached, f)
						}
					}
				}
			}
			h.compiles.release(project)
		}
	}
	m.err = err
	close(m.ready)
	if err != nil {
		h.mu.Lock()
		if h.modules[m.key] == m {
			delete(h.modules, m.key) // the next caller tries again
		}
		h.mu.Unlock()
		h.releaseModule(m)
		return nil, err
	}
	return m, nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// cacheFiles answers the files under the compilation cache's directory (nil if unreadable).
func cacheFiles(dir string) map[string]bool {
	files := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files[path] = true
		}
		return err
	})
	if err != nil {
		return nil
	}
	return files
}

// trimCache removes the oldest files under dir until the rest take at most max bytes.
func trimCache(dir string, max int64, log *slog.Logger) {
	type file struct {
		path string
		size int64
		mod  time.Time
	}
	var files []file
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files = append(files, file{path, info.Size(), info.ModTime()})
		total += info.Size()
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		log.Warn("plugin cache: could not read it to bound its size", "dir", dir, "err", err)
		return
	}
	if total <= max {
		return
	}
	slices.SortFunc(files, func(a, b file) int { return a.mod.Compare(b.mod) })
	removed := 0
	for _, f := range files {
		if total <= max {
			break
		}
		if err := os.Remove(f.path); err != nil {
			log.Warn("plugin cache: remove", "err", err)
			continue
		}
		total -= f.size
		removed++
	}
	log.Info("plugin cache: removed the oldest compiled code to bound its size", "dir", dir, "files", removed, "bytes", total, "max", max)
}

// dropCached removes the files m's compile added to the compilation cache: wazero never
// evicts, and a module Validate refused after compiling it must leave nothing on disk.
func (h *Host) dropCached(m *module) {
	for _, f := range m.cached {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			h.log.Warn("plugin cache: remove a refused module's code", "err", err)
		}
	}
}

func (h *Host) releaseModule(m *module) {
	h.mu.Lock()
	m.refs--
	last := m.refs == 0
	if last && h.modules[m.key] == m {
		delete(h.modules, m.key)
	}
	h.mu.Unlock()
	if last && m.cm != nil {
		_ = m.cm.Close(context.Background())
	}
}
