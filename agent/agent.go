package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Limits and defaults of the agent's API.
const (
	// MaxFileBytes bounds a PUT /v1/files body (413 beyond it).
	MaxFileBytes = 100 << 20
	// MaxExecBodyBytes bounds a POST /v1/exec body: session.MaxStdinBytes of stdin, base64-encoded,
	// plus argv and env.
	MaxExecBodyBytes = 4 << 20
	// MaxQuiesce is the longest quiesce a caller may ask for.
	MaxQuiesce = 60 * time.Second
	// ExitTimedOut is the exit_code of an exec killed at its timeout (as coreutils' timeout(1)).
	ExitTimedOut = 124
	// ExitCannotRun is the exit_code of an exec whose command exists but could not be started.
	ExitCannotRun = 126
	// ExitNotFound is the exit_code of an exec whose command (or cwd) was not found.
	ExitNotFound = 127

	outputChunkBytes = 32 << 10
	// spareOSThreads is how many OS threads the agent makes at start and keeps idle where the
	// guest's processes share its process limit (spareThreadsFor): Go dies when it cannot
	// create a thread, and a guest at its process limit leaves none to create.
	spareOSThreads = 24
	shutdownGrace  = 5 * time.Second
)

// Config configures Serve.
type Config struct {
	// Socket is the Unix socket path to listen on, e.g. /run/wb/agent.sock. Its directory is
	// created; a stale socket file is removed. Unused with VsockPort.
	Socket string
	// VsockPort, when set, makes the agent listen on this AF_VSOCK port (any context id)
	// instead of Socket: the agent of a VM, reached by the host over the VMM's vsock device.
	VsockPort uint32
	// Root is the default working directory of exec and pty, and the base of relative file paths
	// (e.g. /workspace). It is created if missing. Empty means "/".
	Root string
	// Logger receives the agent's logs; nil discards them.
	Logger *slog.Logger
	// EgressListen and EgressSocket, when both are set, relay TCP connections made to
	// EgressListen (an address on the guest's loopback, given to processes as their HTTP proxy)
	// to the node's egress proxy on the host Unix socket EgressSocket.
	EgressListen, EgressSocket string
	// Reap makes the agent reap orphaned children, as PID 1 must. The reaper never collects a
	// child the agent started itself (an exec's or a PTY's): it peeks at zombies with
	// waitid(WNOWAIT) and collects only pids it does not know, so exit codes are never stolen.
	// It assumes nothing else in the process starts children.
	Reap bool
	// Init says the agent is the guest's init: it drops CAP_SYS_ADMIN (which it may hold only
	// to mount the pids cgroup of PidsMax) from every thread before it serves, and keeps a few
	// spare OS threads, so that a guest at its process limit cannot starve it of threads.
	Init bool
	// PidsMax, when positive, is the guest's process limit, kept below the sandbox's: every
	// exec and PTY process starts in a pids cgroup with this pids.max, so a fork bomb meets it
	// while the agent (outside that cgroup) keeps answering. It needs a cgroupfs the agent may
	// mount (gVisor's, with CAP_SYS_ADMIN); without one the agent logs a warning and the
	// sandbox's limit applies alone; so does it where the agent is not the guest's init
	// (Init). When the guest's processes stay at the limit for 1 s (every fork failing: a
	// fork bomb), the agent SIGKILLs them all, in rounds until none is left, and logs it:
	// under gVisor's ptrace platform a bomb left churning keeps adding host threads until the
	// sandbox dies.
	PidsMax int
}

// server is one Serve call's state. It holds no package-level state.
type server struct {
	ctx       context.Context // Serve's
	fwd       *forwarder      // nil without egress
	root      string
	socket    string
	vsockPort uint32 // listen on this vsock port instead of socket
	log       *slog.Logger
	procs     *procTable
	// devNull is every command's stdin without one of its own (nil: os/exec opens one each
	// time); open until Serve returns.
	devNull *os.File

	handlers  tracker      // in-flight handlers, waited for on shutdown
	quiesceCh chan quiesce // from the quiesce handler to the serve loop

	mu       sync.Mutex
	sessions map[*websocket.Conn]context.CancelFunc // open PTY websockets (hijacked connections)
	runners  map[string]*waitingRunner              // started runners waiting for their exec, by name
	// runnerStarts counts runners being started (before their process exists), starting
	// holds those started but not yet ready: both count as idle for the guard (waitingRunners;
	// runnerStarts one at most).
	runnerStarts int
	starting     map[*proc]struct{}
}

// Serve listens on cfg.Socket and serves the agent's API until ctx is done, then closes every
// connection, kills what the open execs and PTYs run, and returns nil. A quiesce request closes
// the listener and all connections for a while and then listens again on the same path.
func Serve(ctx context.Context, cfg Config) error {
	if cfg.Socket == "" && cfg.VsockPort == 0 {
		return errors.New("agent: Config.Socket or Config.VsockPort is required")
	}
	socket, err := filepath.Abs(cfg.Socket)
	if err != nil {
		return fmt.Errorf("agent: socket path: %w", err)
	}
	if cfg.VsockPort != 0 {
		socket = ""
	}
	root := cfg.Root
	if root == "" {
		root = "/"
	}
	if root, err = filepath.Abs(root); err != nil {
		return fmt.Errorf("agent: root: %w", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("agent: create root: %w", err)
	}
	if socket != "" {
		if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
			return fmt.Errorf("agent: create socket directory: %w", err)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &server{
		ctx:       ctx,
		root:      root,
		socket:    socket,
		vsockPort: cfg.VsockPort,
		log:       log,
		procs:     newProcTable(),
		quiesceCh: make(chan quiesce, 1),
		sessions:  map[*websocket.Conn]context.CancelFunc{},
		runners:   map[string]*waitingRunner{},
	}

	if s.devNull, err = openDevNull(); err != nil {
		log.Warn("agent: each command opens its own stdin", "err", err) // os/exec's own open, as before
	} else {
		defer s.devNull.Close()
	}
	s.procs.cg = setupChildCgroup(ctx, log, cfg.PidsMax, cfg.Init)
	if cfg.Init {
		if err := dropSysAdmin(); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		if err := undumpable(); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		spareThreads(spareThreadsFor(s.procs.cg))
	}

	guardCtx, stopGuard := context.WithCancel(ctx)
	defer stopGuard()
	go s.procs.cg.guard(guardCtx, log, s.waitingRunners, s.procs.started)

	reapCtx, stopReaper := context.WithCancel(context.WithoutCancel(ctx))
	reaperDone := make(chan struct{})
	if cfg.Reap {
		go func() {
			defer close(reaperDone)
			s.procs.reapLoop(reapCtx, log)
		}()
	} else {
		close(reaperDone)
	}
	defer func() {
		stopReaper()
		<-reaperDone
	}()

	if cfg.EgressListen != "" && cfg.EgressSocket != "" {
		s.fwd = newForwarder(cfg.EgressListen, cfg.EgressSocket)
		if err := s.fwd.listen(); err != nil {
			return fmt.Errorf("agent: egress listener: %w", err)
		}
		go s.fwd.serve(ctx)
	}
	ln, err := s.listen()
	if err != nil {
		return err
	}
	log.Info("agent listening", "addr", ln.Addr().String(), "root", root, "pid", os.Getpid(), "reap", cfg.Reap)
	for {
		g := s.newGeneration(ctx, ln)
		serveErr := make(chan error, 1)
		go func() { serveErr <- g.srv.Serve(ln) }()

		var q quiesce
		select {
		case <-ctx.Done():
			s.shutdown(g, serveErr)
			return nil
		case q = <-s.quiesceCh:
		case err := <-serveErr:
			if !g.isQuiescing() {
				_ = g.srv.Close()
				s.closeSessions()
				s.waitHandlers()
				return fmt.Errorf("agent: serve %s: %w", ln.Addr(), err)
			}
			// The quiesce handler closed the listener; it sends the duration, and answers once
			// this loop has released everything.
			select {
			case <-ctx.Done():
				s.shutdown(g, nil)
				return nil
			case q = <-s.quiesceCh:
			}
			serveErr <- nil
		}
		// Quiesce: nothing of the host's may stay open in the guest.
		_ = g.srv.Close()
		s.closeSessions()
		if s.fwd != nil {
			s.fwd.pause()
		}
		<-serveErr
		close(q.released)
		log.Info("agent quiesced", "for", q.most, "resume_file", q.resumeFile)
		if !s.awaitResume(ctx, q) {
			s.waitHandlers()
			return nil
		}
		if ln, err = s.relisten(ctx); err != nil {
			s.waitHandlers()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if s.fwd != nil {
			s.fwd.resume()
		}
		log.Info("agent listening again", "addr", ln.Addr().String())
	}
}

func (s *server) shutdown(g *generation, serveErr <-chan error) {
	_ = g.srv.Close()
	s.closeSessions()
	if serveErr != nil {
		<-serveErr
	}
	s.waitHandlers()
	s.dropRunners()
	s.log.Info("agent stopped")
}

func (s *server) waitHandlers() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if !s.handlers.closeAndWait(ctx) {
		s.log.Warn("agent: handlers still running at shutdown")
	}
}

// relisten listens on the socket again after a quiesce, retrying while the path cannot be bound
// (e.g. a restored guest whose bind mount is not back yet).
func (s *server) relisten(ctx context.Context) (net.Listener, error) {
	delay := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		ln, err := s.listen()
		if err == nil {
			return ln, nil
		}
		s.log.Warn("agent: listen again failed; retrying", "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// listen binds the agent's vsock port or its Unix socket.
func (s *server) listen() (net.Listener, error) {
	if s.vsockPort != 0 {
		return listenVsock(s.vsockPort)
	}
	return listenUnix(s.socket)
}

// listenUnix binds path, removing a stale socket file first (never any other kind of file).
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("agent: %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("agent: remove stale socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("agent: listen: %w", err)
	}
	return ln, nil
}

// generation is one listening period: a listener, its http.Server and its connections.
type generation struct {
	ln  net.Listener
	srv *http.Server

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	quiescing bool
}

type (
	genKey  struct{}
	connKey struct{}
)

func (s *server) newGeneration(ctx context.Context, ln net.Listener) *generation {
	g := &generation{ln: ln, conns: map[net.Conn]struct{}{}}
	g.srv = &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(ctx, genKey{}, g)
		},
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ConnState: g.connState,
	}
	return g
}

func (g *generation) connState(c net.Conn, st http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch st {
	case http.StateNew:
		if g.quiescing {
			_ = c.Close()
			return
		}
		g.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(g.conns, c)
	}
}

func (g *generation) isQuiescing() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.quiescing
}

// beginQuiesce marks the generation quiescing, closes its listener and every connection but
// keep. It reports false if a quiesce is already under way.
func (g *generation) beginQuiesce(keep net.Conn) bool {
	g.mu.Lock()
	if g.quiescing {
		g.mu.Unlock()
		return false
	}
	g.quiescing = true
	var others []net.Conn
	for c := range g.conns {
		if c != keep {
			others = append(others, c)
			delete(g.conns, c)
		}
	}
	g.mu.Unlock()
	_ = g.ln.Close()
	for _, c := range others {
		_ = c.Close()
	}
	return true
}

// addSession registers an open PTY websocket so that quiesce and shutdown can close it.
func (s *server) addSession(c *websocket.Conn, cancel context.CancelFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessions[c] = cancel
}

func (s *server) removeSession(c *websocket.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, c)
}

// closeSessions closes every open PTY websocket at once (its socket included) and cancels its
// session, which then kills its process.
func (s *server) closeSessions() {
	s.mu.Lock()
	sessions := s.sessions
	s.sessions = map[*websocket.Conn]context.CancelFunc{}
	s.mu.Unlock()
	for c, cancel := range sessions {
		cancel()
		_ = c.CloseNow()
	}
}

func (s *server) routes() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.handlers.add() {
			writeError(w, http.StatusServiceUnavailable, "unavailable", "the agent is shutting down", "")
			return
		}
		defer s.handlers.done()
		if g, ok := r.Context().Value(genKey{}).(*generation); ok && g.isQuiescing() {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusServiceUnavailable, "unavailable", "the agent is quiescing", "")
			return
		}
		var h http.HandlerFunc
		allow := http.MethodGet
		switch r.URL.Path {
		case "/v1/health":
			h = onlyMethod(r, http.MethodGet, s.handleHealth)
		case "/v1/procs":
			h = onlyMethod(r, http.MethodGet, s.handleProcs)
		case "/v1/procs/end":
			allow = http.MethodPost
			h = onlyMethod(r, allow, s.handleEndProcs)
		case "/v1/exec":
			allow = http.MethodPost
			h = onlyMethod(r, allow, s.handleExec)
		case "/v1/runners":
			allow = http.MethodPost
			h = onlyMethod(r, allow, s.handleRunners)
		case "/v1/pty":
			h = onlyMethod(r, http.MethodGet, s.handlePTY)
		case "/v1/quiesce":
			allow = http.MethodPost
			h = onlyMethod(r, allow, s.handleQuiesce)
		case "/v1/files":
			allow = "GET, PUT, DELETE"
			switch r.Method {
			case http.MethodGet:
				h = s.handleFileGet
			case http.MethodPut:
				h = s.handleFilePut
			case http.MethodDelete:
				h = s.handleFileDelete
			}
		default:
			writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route %s %s", r.Method, r.URL.Path), "")
			return
		}
		if h == nil {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s allows %s, not %s", r.URL.Path, allow, r.Method), "")
			return
		}
		h(w, r)
	})
}

func onlyMethod(r *http.Request, method string, h http.HandlerFunc) http.HandlerFunc {
	if r.Method != method {
		return nil
	}
	return h
}

func (s *server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "pid": os.Getpid()})
}

// quiesceRequest is the body of POST /v1/quiesce.
type quiesceRequest struct {
	ForMs int64 `json:"for_ms"`
	// ResumeFile, when set, is a file name in the socket's directory whose appearance ends the
	// quiesce before for_ms: the host creates it once its checkpoint is done, so the agent
	// stays off exactly as long as the checkpoint takes (for_ms then only bounds it).
	ResumeFile string `json:"resume_file,omitempty"`
}

// quiesce is one accepted quiesce: off for at most most, or until resumeFile appears.
type quiesce struct {
	most       time.Duration
	resumeFile string
	released   chan struct{} // closed by the serve loop once the guest holds nothing of the host's
}

// resumeFilePattern: a plain file name, so the host names nothing outside the socket's directory.
var resumeFilePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// resumePoll is how often a quiesced agent looks for its resume file.
const resumePoll = 10 * time.Millisecond

// awaitResume waits out a quiesce: until q.most has passed or q's resume file appears in the
// socket's directory (it is then removed). It reports false when ctx ended first.
func (s *server) awaitResume(ctx context.Context, q quiesce) bool {
	t := time.NewTimer(q.most)
	defer t.Stop()
	var tick <-chan time.Time
	path := ""
	if q.resumeFile != "" && s.socket != "" {
		path = filepath.Join(filepath.Dir(s.socket), q.resumeFile)
		tk := time.NewTicker(resumePoll)
		defer tk.Stop()
		tick = tk.C
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-tick:
			if _, err := os.Stat(path); err == nil {
				_ = os.Remove(path)
				return true
			}
		}
	}
}

// handleQuiesce closes the listener and every connection, answers on its own (hijacked)
// connection with a body delimited by the connection's close, and has the serve loop listen
// again after for_ms. Because the answer ends only when the connection closes, a client that has
// read it knows the agent holds no host socket any more.
func (s *server) handleQuiesce(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 4096))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "cannot read the body: "+err.Error(), "")
		return
	}
	var req quiesceRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", `the body must be {"for_ms":N}: `+err.Error(), "")
		return
	}
	if req.ForMs < 1 || req.ForMs > MaxQuiesce.Milliseconds() {
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("for_ms must be 1–%d, got %d", MaxQuiesce.Milliseconds(), req.ForMs), "for_ms")
		return
	}
	if req.ResumeFile != "" && !resumeFilePattern.MatchString(req.ResumeFile) {
		writeError(w, http.StatusBadRequest, "invalid_request", "resume_file must be a file name of 1–64 letters, digits, '.', '_' or '-'", "resume_file")
		return
	}
	g, _ := r.Context().Value(genKey{}).(*generation)
	own, _ := r.Context().Value(connKey{}).(net.Conn)
	if g == nil || own == nil {
		writeError(w, http.StatusInternalServerError, "internal", "no connection state", "")
		return
	}
	q := quiesce{most: time.Duration(req.ForMs) * time.Millisecond, resumeFile: req.ResumeFile, released: make(chan struct{})}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", "cannot take over the connection: "+err.Error(), "")
		return
	}
	if !g.beginQuiesce(conn) {
		_ = conn.Close()
		return
	}
	s.closeSessions()
	// Answered once the serve loop has let go of everything (the egress relay's listener
	// too): the host may checkpoint the guest the moment it has read the answer.
	s.quiesceCh <- q // buffered; one quiesce per generation
	select {
	case <-q.released:
	case <-s.ctx.Done():
		_ = conn.Close() // shutting down: no answer, and the host takes it as not quiesced
		return
	}
	// released: answered after everything was let go (an older agent answered before its
	// egress relay had closed; see Client.QuiesceUntil).
	payload, _ := json.Marshal(map[string]any{"ok": true, "for_ms": req.ForMs, "released": true})
	_, _ = fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n%s\n", payload)
	_ = brw.Flush()
	_ = conn.Close()
}

func badRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: "invalid_request", Message: fmt.Sprintf(format, args...), Param: param}
}

func writeAPIError(w http.ResponseWriter, e *Error) {
	writeError(w, e.Status, e.Code, e.Message, e.Param)
}

func writeError(w http.ResponseWriter, status int, code, message, param string) {
	writeJSON(w, status, map[string]any{"error": Error{Code: code, Message: message, Param: param}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"cannot encode the answer"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// tracker counts in-flight handlers so that shutdown can wait for them (it kills what they run).
type tracker struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{}
}

func (t *tracker) add() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tracker) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// closeAndWait refuses new handlers and waits for the running ones; false if ctx ended first.
func (t *tracker) closeAndWait(ctx context.Context) bool {
	t.mu.Lock()
	t.closed = true
	if t.n == 0 {
		t.mu.Unlock()
		return true
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	idle := t.idle
	t.mu.Unlock()
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}
