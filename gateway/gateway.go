package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"wb/agent"
	"wb/console"
	"wb/desktop"
	"wb/hypervisor"
	"wb/internal/stallwrite"
	"wb/placer"
	"wb/plugins"
	"wb/policies"
	"wb/quota"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// Guests is what the gateway asks of the node that runs a session's guest.
type Guests interface {
	Exec(ctx context.Context, s *session.Session, req session.ExecRequest, argv []string, out func(session.ExecChunk) error) (session.ExecResult, error)
	// Agent answers the guest's agent, for files and PTY; it counts as activity.
	Agent(ctx context.Context, s *session.Session) (*agent.Client, error)
	// Touch records activity (a PTY frame).
	Touch(s *session.Session)
	// Retime hands the node a session's new timers after a PATCH; an error when the node
	// cannot apply them (it keeps the old ones).
	Retime(ctx context.Context, s *session.Session) error
	Pause(ctx context.Context, s *session.Session) error
	Resume(ctx context.Context, s *session.Session) error
	// Snapshot saves the guest; memory only when asked and the back end can. It answers
	// whether memory was included, the size, and the root disk image a restore of its memory
	// needs (hypervisor.SnapshotInfo.RootImage).
	Snapshot(ctx context.Context, s *session.Session, snapshotID string, includeMemory bool) (hypervisor.SnapshotInfo, error)
	// Stop tears the guest down; the node then ends the session (stopping → terminal).
	Stop(ctx context.Context, s *session.Session) error
	// StopSaving is Stop after the node saved the guest, memory and all, as snapshot
	// snapshotID where its back end can (a desktop's sleep). It answers whether memory was
	// saved (false: nothing was), the size and the root disk image a restore of its memory
	// needs, as Snapshot does; the session ends either way.
	StopSaving(ctx context.Context, s *session.Session, snapshotID string) (hypervisor.SnapshotInfo, error)
}

// Config wires a Server.
type Config struct {
	Store    *store.Store
	Limiter  *quota.RateLimiter
	Accounts *quota.Accounts  // spend caps, spend and usage reports
	Admitter session.Admitter // nil: Chain of Policies and Plugins (allow all without them)
	Policies *policies.Engine // Rego: admission, and the policy routes (nil: none)
	Plugins  *plugins.Host    // tenant Wasm: admission, and the plugin routes (nil: none)
	Guests   Guests           // nil until a node is attached
	Webhooks *webhooks.Registry
	Tiers    session.Tiers
	Catalog  session.Catalog
	Regions  []string // the first is the default
	// PublicURL is the base of connect URLs (http://127.0.0.1:8080).
	PublicURL string
	AdminKey  string
	// MetricsToken, when set, is a second bearer token /metrics accepts besides AdminKey.
	MetricsToken string
	// MetricsElsewhere: the operator serves Metrics.Handler on its own address, so the API
	// answers 404 for /metrics.
	MetricsElsewhere bool
	Logger           *slog.Logger
	Metrics          *Metrics
	Now              func() time.Time
	// MaxOutputBytes caps each stream of a buffered exec or run result (0:
	// session.DefaultMaxOutputBytes, 8 MiB); MaxReplayBytes caps an answer kept for an
	// Idempotency-Key replay (0: 2×MaxOutputBytes + 1 MiB).
	MaxOutputBytes int
	MaxReplayBytes int
	// MaxConcurrentExecs and MaxAsyncRuns cap a project's execs in progress and its queued or
	// running async runs on this gateway (0: DefaultMaxConcurrentExecs, DefaultMaxAsyncRuns).
	MaxConcurrentExecs int
	MaxAsyncRuns       int
	// MaxConcurrentFileCalls caps a project's file calls (read, list, write, delete of a
	// session's or a desktop's files) and desktop screenshots in progress on this gateway
	// (0: DefaultMaxConcurrentFileCalls).
	MaxConcurrentFileCalls int
	// MaxConcurrentPTYs caps a project's open PTYs on this gateway (0:
	// DefaultMaxConcurrentPTYs).
	MaxConcurrentPTYs int
	// MaxDesktopMCPListens caps a desktop's open MCP listen streams (subscriptions/listen) on
	// this gateway (0: DefaultMaxDesktopMCPListens).
	MaxDesktopMCPListens int
	// MaxStoredOutputBytes bounds a project's stored output in Redis: its runs' (kept 7 days,
	// each up to 2×MaxOutputBytes) and its answers kept for Idempotency-Key replays (24 h,
	// each up to MaxReplayBytes). Past it the oldest outputs are dropped: such a run then
	// shows output_expired, such a replay answers 409 replay_too_large. No run is refused for
	// it (0: DefaultMaxStoredOutputBytes, 1 GiB; negative: no bound).
	MaxStoredOutputBytes int64
	// DesktopIdle is how long a desktop may go unused before it sleeps (0:
	// DefaultDesktopIdle, 15 minutes). DesktopTemplate is its sessions' template ("":
	// tpl_desktop when the catalog has it, else the default). DesktopSetup, when set, runs
	// in each fresh (not restored) desktop session before the desktop counts as running
	// (wb/desktop/guest's Start: display, window manager, browser).
	DesktopIdle     time.Duration
	DesktopTemplate string
	DesktopSetup    func(ctx context.Context, ex desktop.Execer) error
	// DesktopFileTimeout bounds an MCP file tool's call to the desktop's agent (0:
	// DefaultDesktopFileTimeout).
	DesktopFileTimeout time.Duration
	// FileTimeout bounds a file call's (read, list, write, delete of a session's or a
	// desktop's files) waits on the guest's agent: in all, FileTimeout plus a second for each
	// fileMinRate bytes moved (0: DefaultFileTimeout). DesktopScreenTimeout bounds a
	// screenshot of a desktop's display (0: DefaultDesktopScreenTimeout).
	FileTimeout          time.Duration
	DesktopScreenTimeout time.Duration
	// WorkLease is how long the work of a desktop's transition, of a session's snapshot or of
	// a run may go unrenewed (its gateway died) before another gateway resumes or ends it (0:
	// DefaultWorkLease).
	WorkLease time.Duration
	// DesktopSweep is how long the fleet waits between two walks of every desktop (one
	// gateway's, in its turn), which give a lease to those left starting or stopping without
	// one, so that a recovery resumes them (0: DefaultDesktopSweep). A turn lasts the period of
	// the gateway that took it: the fleet's gateways should have the same.
	DesktopSweep time.Duration
	// DesktopRecordFor is how long the end of a desktop's sleep or stop keeps trying to record
	// itself while Redis fails before it leaves the work to a recovery (0: 2 minutes).
	DesktopRecordFor time.Duration
	// DesktopAdmitWait is how long a desktop's start waits out admission's rate and
	// concurrency limits before it is refused with their 429 (0: a minute).
	DesktopAdmitWait time.Duration
	// WriteStall is how long a write to a caller that takes none of it may wait before the
	// call ends (0: DefaultWriteStall): an exec's answer (the exec ends, and the command in
	// the guest with it), a file's read, a desktop's screen, an MCP call's answer, a run's
	// (and a replay for an Idempotency-Key), a usage report, a frame of a PTY's output (the
	// PTY ends, and the program in the guest with it), and the last writes of every answer,
	// which net/http makes once its handler returned (Handler). A caller that stays connected
	// and reads no more would hold the call, its slot among the project's, the node's
	// connection and the guest's agent for ever. One bound for every call: the caller's stall
	// is the same whatever it called.
	WriteStall time.Duration
	// NodeTimeout is how long a node may go without a heartbeat before it counts as dead, as
	// the placer judges it (0: placer.DefaultHeartbeatTimeout, the placer's default): a
	// restore that only some nodes can do is refused when none of them is live, and a desktop
	// is refused when no live node has room for it.
	NodeTimeout time.Duration
}

// Server is the HTTP API.
type Server struct {
	Config
	log  *slog.Logger
	mux  *http.ServeMux
	auth authCache
	// bg runs work that outlives a request (async runs, teardown); Close waits for it.
	bg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
	// execs, asyncRuns, fileCalls and ptys count work in progress per project, for the caps
	// above.
	execs, asyncRuns, fileCalls, ptys *projectSlots
	// starts wakes the runs waiting for their session to start (nil: they look alone).
	starts *startWaits
	// releases and abandons count what refused creates left being cleaned up in the
	// background (releaseLater, abandonLater): one budget each, so that either kind, piling
	// up in a long outage, leaves the other its own.
	releases, abandons atomic.Int32
	// access is the data path's state: grant signers and ext_authz's lookups (authz*.go).
	access edgeAccess
	// idleKick wakes the desktop idle loop when this server sets an earlier deadline.
	idleKick chan struct{}
	// leases is the desktop transitions this server works on (desktop_recovery.go);
	// snapshots, the sessions' snapshots (snapshot_recovery.go); runs, the attempts at runs
	// (run_recovery.go).
	leases    workingLeases[store.DesktopRef]
	snapshots workingLeases[store.SessionRef]
	runs      workingLeases[store.RunRef]
	// ptyInputWait is how long a frame of a PTY's input may wait to go to the guest
	// (defaultPTYInputWait; tests shorten it).
	ptyInputWait time.Duration
}

// New returns a Server. Call Close to stop its background work.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Limiter == nil || cfg.Accounts == nil || cfg.Webhooks == nil {
		return nil, errors.New("gateway: Store, Limiter, Accounts and Webhooks are required")
	}
	if len(cfg.Catalog) == 0 || len(cfg.Regions) == 0 {
		return nil, errors.New("gateway: Catalog and Regions must not be empty")
	}
	if cfg.Admitter == nil {
		cfg.Admitter = Chain{Policies: cfg.Policies, Plugins: cfg.Plugins, Now: cfg.Now}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NodeTimeout <= 0 {
		cfg.NodeTimeout = placer.DefaultHeartbeatTimeout
	}
	if cfg.Tiers == (session.Tiers{}) {
		cfg.Tiers = session.DefaultTiers()
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = session.DefaultMaxOutputBytes
	}
	if cfg.MaxReplayBytes <= 0 {
		cfg.MaxReplayBytes = 2*cfg.MaxOutputBytes + 1<<20
	}
	if cfg.MaxConcurrentExecs <= 0 {
		cfg.MaxConcurrentExecs = DefaultMaxConcurrentExecs
	}
	if cfg.MaxAsyncRuns <= 0 {
		cfg.MaxAsyncRuns = DefaultMaxAsyncRuns
	}
	if cfg.MaxStoredOutputBytes == 0 {
		cfg.MaxStoredOutputBytes = DefaultMaxStoredOutputBytes
	}
	if cfg.WriteStall <= 0 {
		cfg.WriteStall = DefaultWriteStall
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Config: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel,
		execs: newProjectSlots("exec", "too_many_execs"), asyncRuns: newProjectSlots("async run", "too_many_runs"),
		fileCalls: newFileCallSlots(), ptys: newPTYSlots()}
	s.auth = authCache{m: map[string]authEntry{}}
	s.idleKick = make(chan struct{}, 1)
	s.ptyInputWait = defaultPTYInputWait
	s.routes()
	s.watchChanges(ctx)
	s.starts = newStartWaits()
	s.goBackground(func() {
		s.Store.WatchStarts(ctx, s.log, store.StartWatch{Started: s.starts.started, Live: s.starts.live})
	})
	s.goBackground(func() { s.runDesktopIdle(ctx) })
	s.goBackground(func() { s.runDesktopRecovery(ctx) })
	s.goBackground(func() { s.runDesktopSweep(ctx) })
	s.goBackground(func() { s.runSnapshotRecovery(ctx) })
	s.goBackground(func() { s.runRunRecovery(ctx) })
	s.goBackground(func() { s.migrateLegacyRuns(ctx) })
	return s, nil
}

// outputBudget is the budget of a project's stored output for the store (0: none).
func (s *Server) outputBudget() int64 { return max(s.MaxStoredOutputBytes, 0) }

// goBackground runs f in the background; Close waits for it.
func (s *Server) goBackground(f func()) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		f()
	}()
}

// Close stops background work and waits for it.
func (s *Server) Close() {
	s.cancel()
	s.bg.Wait()
}

// Handler is the whole API, with metrics and panic recovery around every route, and
// net/http's last writes of each answer bounded by WriteStall.
func (s *Server) Handler() http.Handler {
	return stallwrite.Handler(s.Metrics.instrument(s.mux), s.WriteStall)
}

type handler func(w http.ResponseWriter, r *http.Request, p store.Project) error

func (s *Server) routes() {
	m := http.NewServeMux()
	api := func(pattern string, h handler) { m.Handle(pattern, s.authed(h)) }
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, Health{Status: "ok"}) })
	// 240 KB, to anyone: a caller that takes none of it is cut, as from the API's large answers.
	m.HandleFunc("GET /v1/openapi.json", s.stallBoundedHTTP(serveOpenAPI))
	// The web console (pages that call this API, to anyone) and /metrics (tens of kilobytes)
	// write past net/http's buffer from their handlers: a caller that takes none is cut too.
	m.Handle("GET "+console.Prefix+"/", s.stallBoundedHTTP(console.Handler().ServeHTTP))
	if !s.MetricsElsewhere {
		m.Handle("GET /metrics", s.metricsGuard(s.stallBoundedHTTP(s.Metrics.Handler().ServeHTTP)))
	}
	m.HandleFunc("POST /v1/admin/projects", s.adminCreateProject)
	m.Handle("GET /v1/admin/projects/{id}/plan", s.admin(s.adminGetPlan))
	m.Handle("PUT /v1/admin/projects/{id}/plan", s.admin(s.adminPutPlan))
	m.Handle("DELETE /v1/admin/projects/{id}/keys/{prefix}", s.admin(s.adminRevokeKey))
	m.Handle("GET /v1/admin/nodes", s.admin(s.adminListNodes))
	m.Handle("PUT /v1/admin/nodes/{id}/draining", s.admin(s.adminDrainNode))

	api("POST /v1/sessions", s.idempotent(s.createSession))
	api("GET /v1/sessions", s.stallBounded(s.listSessions)) // up to 100 sessions and their metadata: megabytes
	api("GET /v1/sessions/{id}", s.getSession)
	api("PATCH /v1/sessions/{id}", s.patchSession)
	api("DELETE /v1/sessions/{id}", s.deleteSession)
	api("POST /v1/sessions/{id}", s.idempotent(s.sessionAction)) // {id}:pause, :resume, :snapshot
	// The data path: an API key, or the session's connect token (authz_access.go).
	s.dataRoutes(func(pattern string, h handler) { m.Handle(pattern, s.dataPath(h)) })

	api("GET /v1/snapshots", s.stallBounded(s.listSnapshots)) // up to 100 snapshots: tens of kilobytes
	api("GET /v1/snapshots/{id}", s.getSnapshot)
	api("DELETE /v1/snapshots/{id}", s.deleteSnapshot)

	// A run's answer holds its output (up to MaxOutputBytes a stream).
	api("POST /v1/runs", s.idempotent(s.stallBounded(s.createRun)))
	api("GET /v1/runs/{id}", s.stallBounded(s.getRun))

	api("POST /v1/webhook_endpoints", s.idempotent(s.createEndpoint))
	api("GET /v1/webhook_endpoints", s.stallBounded(s.listEndpoints))
	api("GET /v1/webhook_endpoints/{id}", s.getEndpoint)
	api("DELETE /v1/webhook_endpoints/{id}", s.deleteEndpoint)
	api("GET /v1/webhook_endpoints/{id}/deliveries", s.stallBounded(s.listDeliveries)) // up to 100, with their errors

	s.desktopRoutes(api)

	api("GET /v1/templates", s.listTemplates)
	api("GET /v1/limits", s.getLimits)
	api("PUT /v1/limits", s.putLimits)
	api("GET /v1/usage", s.stallBounded(s.usage)) // a line a session of its range: megabytes
	api("PUT /v1/policies/{name}", s.putPolicy)
	api("GET /v1/policies", s.stallBounded(s.listPolicies))
	api("GET /v1/policies/{name}", s.stallBounded(s.getPolicy)) // up to 20 versions
	api("DELETE /v1/policies/{name}", s.deletePolicy)
	api("PUT /v1/plugins/{name}", s.putPlugin)
	api("GET /v1/plugins", s.stallBounded(s.listPlugins))
	api("GET /v1/plugins/{name}", s.getPlugin)
	api("DELETE /v1/plugins/{name}", s.deletePlugin)
	m.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, &apiError{Status: 404, Type: "not_found", Code: "no_route", Message: "no route " + r.Method + " " + r.URL.Path})
	}))
	s.mux = m
}

// dataRoutes mounts exec, PTY and files: the routes that the edge sends straight to the
// session's node, which serves them with these same handlers (NewDataPath).
func (s *Server) dataRoutes(handle func(pattern string, h handler)) {
	handle("POST /v1/sessions/{id}/exec", s.idempotent(s.exec))
	handle("GET /v1/sessions/{id}/pty", s.ptyCall(s.pty))
	handle("GET /v1/sessions/{id}/files", s.fileCall(s.getFile))
	handle("PUT /v1/sessions/{id}/files", s.fileCall(s.putFile))
	handle("DELETE /v1/sessions/{id}/files", s.fileCall(s.deleteFile))
}

// authed authenticates the bearer key (step 1 of admission) and calls h with its project.
func (s *Server) authed(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || key == "" {
			s.writeError(w, r, &apiError{Status: 401, Type: "unauthenticated", Code: "unauthenticated", Message: "send Authorization: Bearer <api key>"})
			return
		}
		p, err := s.authenticate(r.Context(), key)
		if err != nil {
			if errors.Is(err, store.ErrBadKey) || errors.Is(err, store.ErrNotFound) {
				err = &apiError{Status: 401, Type: "unauthenticated", Code: "unauthenticated", Message: "unknown API key"}
			}
			s.writeError(w, r, err)
			return
		}
		if err := h(w, r, p); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// stallBounded serves h with every write to its caller bounded by WriteStall: a caller that
// stays connected but takes none of a large answer (an MCP tool's result, a run's output, a
// usage report) ends the call, which would otherwise hold the handler, and the answer in
// memory, for as long as the caller stayed. Only writes under way are timed: an answer that
// is idle (a stream with nothing to send) is not cut.
func (s *Server) stallBounded(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, p store.Project) error {
		var err error
		s.stallBoundedHTTP(func(w http.ResponseWriter, r *http.Request) { err = h(w, r, p) })(w, r)
		return err
	}
}

// stallBoundedHTTP is stallBounded for a route without a project (the OpenAPI document, the
// console, /metrics).
func (s *Server) stallBoundedHTTP(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sw := stallwrite.New(w, s.WriteStall)
		defer func() {
			sw.Close()
			if sw.Stalled() {
				markCutOff(w) // a replay of the bytes taken would look like a whole answer
				s.log.WarnContext(r.Context(), "an answer broke off: its caller took none of it within the stall",
					"route", r.Pattern, "stall", s.WriteStall)
			}
		}()
		h(sw, r)
	}
}

// authenticate answers key's project: kept (caches.go), or read and kept.
func (s *Server) authenticate(ctx context.Context, key string) (store.Project, error) {
	now := s.Now()
	p, ok, gen := s.auth.get(key, now)
	if ok {
		return p, nil
	}
	p, err := s.Store.Authenticate(ctx, key)
	if err != nil {
		return p, err
	}
	s.auth.put(key, p, now, gen)
	return p, nil
}

func (s *Server) adminCreateProject(w http.ResponseWriter, r *http.Request) {
	if !s.isAdmin(r) {
		s.writeError(w, r, &apiError{Status: 401, Type: "unauthenticated", Code: "unauthenticated", Message: "this route needs the admin key"})
		return
	}
	var req struct {
		Name        string `json:"name"`
		Concurrency *int   `json:"concurrency,omitempty"`
	}
	b, err := readBody(r)
	if err == nil {
		err = decodeStrict(b, &req)
	}
	if err == nil && req.Concurrency != nil && (*req.Concurrency < 0 || *req.Concurrency > 100000) {
		err = errInvalid("concurrency", "must be 0–100000, got %d", *req.Concurrency)
	}
	var p store.Project
	var apiKey string
	if err == nil {
		p, apiKey, err = s.Store.CreateProject(r.Context(), req.Name)
	}
	if err == nil && req.Concurrency != nil {
		err = s.Store.SetConcurrency(r.Context(), p.ID, *req.Concurrency)
		p.Concurrency = *req.Concurrency
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, 201, Project{ProjectID: p.ID, Name: p.Name, APIKey: apiKey, Concurrency: p.Concurrency})
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request, _ store.Project) error {
	def := session.SizeClasses()[0]
	out := []Template{}
	for _, t := range s.Catalog {
		rts, versions := []string{}, map[string]string{}
		for _, rt := range t.Runtimes {
			rts = append(rts, rt.Name)
			if rt.Version != "" {
				versions[rt.Name] = rt.Version
			}
		}
		out = append(out, Template{Object: "template", Name: t.Name, Digest: t.Digest, Ref: t.Ref(), Runtimes: rts, RuntimeVersions: versions,
			DefaultResources: session.Resources{VCPU: def.VCPU, MemoryMiB: def.MemoryMiB, DiskGiB: def.DiskGiB, SizeClass: def.Name}})
	}
	writeJSON(w, 200, session.NewList(out, ""))
	return nil
}
