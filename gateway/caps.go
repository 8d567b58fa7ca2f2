package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"wb/store"
)

// Defaults of the work caps in Config.
const (
	// DefaultMaxConcurrentExecs is how many execs (buffered or streamed, and runs with
	// wait=true) one project may have running at once on one gateway.
	DefaultMaxConcurrentExecs = 64
	// DefaultMaxAsyncRuns is how many runs with wait=false one project may have queued or
	// running at once on one gateway (they run in its goroutines).
	DefaultMaxAsyncRuns = 256
	// DefaultMaxConcurrentFileCalls is how many file calls (read, list, write, delete of a
	// session's or a desktop's files) and desktop screenshots one project may have in
	// progress at once on one gateway: each holds the gateway's memory (a screenshot up to
	// ~9 MiB) and a connection to the node for as long as the guest takes, up to its bound.
	DefaultMaxConcurrentFileCalls = 32
	// DefaultMaxConcurrentPTYs is how many PTYs one project may have open at once on one
	// gateway: each holds two connections (the caller's and the agent's), a goroutine pair
	// and their buffers for as long as the caller keeps it open.
	DefaultMaxConcurrentPTYs = 16
	// DefaultMaxDesktopMCPListens is how many MCP listen streams (subscriptions/listen) one
	// desktop may have open at once on one gateway: each holds a goroutine and the caller's
	// connection for as long as the caller stays, and an MCP client needs one.
	DefaultMaxDesktopMCPListens = 4
	// DefaultMaxStoredOutputBytes is the budget of one project's stored output: runs' and the
	// answers kept for Idempotency-Key replays (store/kept.go).
	DefaultMaxStoredOutputBytes = 1 << 30
	// capRetryAfter is the Retry-After of a 429 for a full cap: work ends in seconds.
	capRetryAfter = time.Second
)

// projectSlots counts one kind of work in flight per project, in this process: the work runs
// here, so this is where it has to be bounded.
type projectSlots struct {
	what string // "exec", "async run": for the 429's message
	code string
	mu   sync.Mutex
	n    map[string]int
}

func newProjectSlots(what, code string) *projectSlots {
	return &projectSlots{what: what, code: code, n: map[string]int{}}
}

// newFileCallSlots counts file calls and screenshots (Server.fileCall).
func newFileCallSlots() *projectSlots {
	return newProjectSlots("file or screen call", "too_many_file_calls")
}

// acquire takes a slot of project, or answers a 429 when it already holds max. The caller
// calls release exactly once after a nil error.
func (ps *projectSlots) acquire(project string, max int) error {
	if !ps.take(project, 1, max) {
		return &apiError{Status: 429, Type: "rate_limited", Code: ps.code, RetryAfter: capRetryAfter,
			Message: fmt.Sprintf("this project already has %d %ss in progress, the most it may have at once; retry when one ends (Retry-After)", max, ps.what)}
	}
	return nil
}

// take takes n slots of key when that leaves it at most max, and answers whether it did. The
// caller gives them back (give) once.
func (ps *projectSlots) take(key string, n, max int) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.n[key]+n > max {
		return false
	}
	ps.n[key] += n
	return true
}

// holding runs f holding one of project's slots; past max it answers acquire's 429, and f
// does not run.
func (ps *projectSlots) holding(project string, max int, f func() error) error {
	if err := ps.acquire(project, max); err != nil {
		return err
	}
	defer ps.release(project)
	return f()
}

// capped serves h holding one of the project's slots in ps, at most max at once. A request
// that check (if set) finds invalid answers its error first, whatever the cap's state: its
// 400 stands however busy the project is (a retry after the 429 would be refused again).
// Past the cap it looks up what the request names (found): one that is not there, or is
// another project's, answers found's 404 rather than the 429, as it would with room. The
// lookup is made only then, so that a call within the cap has no Redis round trip more (h
// looks it up); check makes none.
func capped(ps *projectSlots, max func() int, check func(r *http.Request) error, found func(r *http.Request, p store.Project) error, h handler) handler {
	return func(w http.ResponseWriter, r *http.Request, p store.Project) error {
		if check != nil {
			if err := check(r); err != nil {
				return err
			}
		}
		if err := ps.acquire(p.ID, max()); err != nil {
			var ae *apiError
			if ferr := found(r, p); errors.As(ferr, &ae) && ae.Status == http.StatusNotFound {
				return ferr
			}
			return err
		}
		defer ps.release(p.ID)
		return h(w, r, p)
	}
}

// sessionFound is nil when the session of the request's path is the project's.
func (s *Server) sessionFound(r *http.Request, p store.Project) error {
	_, err := s.loadSession(r.Context(), p, r.PathValue("id"))
	return err
}

// desktopFound is nil when the desktop of the request's path is the project's.
func (s *Server) desktopFound(r *http.Request, p store.Project) error {
	_, err := s.loadDesktop(r, p, r.PathValue("id"))
	return err
}

// fileCall serves h, a route of the session's files, as one of the project's file calls
// (fileCalls, MaxConcurrentFileCalls): past the cap it answers a 429.
func (s *Server) fileCall(h handler) handler {
	return capped(s.fileCalls, s.maxFileCalls, fileRequest, s.sessionFound, h)
}

// desktopFileCall is fileCall for a route of a desktop's files.
func (s *Server) desktopFileCall(h handler) handler {
	return capped(s.fileCalls, s.maxFileCalls, fileRequest, s.desktopFound, h)
}

// desktopScreenCall is desktopFileCall for a desktop's screen, which takes no parameters.
func (s *Server) desktopScreenCall(h handler) handler {
	return capped(s.fileCalls, s.maxFileCalls, nil, s.desktopFound, h)
}

// fileRequest checks what a file call's handler checks of its request before any round trip:
// its path, and a write's declared size.
func fileRequest(r *http.Request) error {
	if _, err := filePath(r); err != nil {
		return err
	}
	if r.Method == http.MethodPut && r.ContentLength > MaxFileBytes {
		return errFileTooLarge()
	}
	return nil
}

// maxFileCalls is MaxConcurrentFileCalls, or its default.
func (s *Server) maxFileCalls() int {
	return cmp.Or(s.MaxConcurrentFileCalls, DefaultMaxConcurrentFileCalls)
}

// newPTYSlots counts open PTYs (Server.ptyCall).
func newPTYSlots() *projectSlots {
	return newProjectSlots("PTY", "too_many_ptys")
}

// ptyCall serves h as one of the project's PTYs (ptys, MaxConcurrentPTYs) from its handshake
// to its end: past the cap it answers a 429 before the upgrade.
func (s *Server) ptyCall(h handler) handler {
	return capped(s.ptys, func() int { return cmp.Or(s.MaxConcurrentPTYs, DefaultMaxConcurrentPTYs) }, func(r *http.Request) error {
		_, err := ptySize(r)
		return err
	}, s.sessionFound, h)
}

func (ps *projectSlots) release(project string) { ps.give(project, 1) }

// give gives back n slots of key that take took.
func (ps *projectSlots) give(key string, n int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.n[key] -= n; ps.n[key] <= 0 {
		delete(ps.n, key)
	}
}
