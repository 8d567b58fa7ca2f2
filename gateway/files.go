package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"wb/agent"
	"wb/internal/stallwrite"
	"wb/node/nodeapi"
	"wb/session"
	"wb/store"
)

// MaxFileBytes bounds one file upload.
const MaxFileBytes = 100 << 20

const (
	// DefaultFileTimeout bounds a file call's waits on the guest's agent (Config.FileTimeout).
	// The agent is the guest's: one that took a call and never answered held the call, and
	// the node's proxy and its connection under it, for as long as the caller waited.
	DefaultFileTimeout = time.Minute
	// fileMinRate (bytes per second) is the slowest pace at which a guest's agent may move a
	// file: each fileMinRate bytes moved add a second to a file call's bound, so that a large
	// file has its time and one that trickles does not hold the call without end.
	fileMinRate = 1 << 20
)

// errGuestTimeout is the 504 of a call to the guest (who) that it did not answer within wait.
func errGuestTimeout(who string, wait time.Duration) *apiError {
	return &apiError{Status: 504, Type: "api_error", Code: "guest_timeout",
		Message: fmt.Sprintf("%s did not answer within %s; try again", who, wait)}
}

// agentClock bounds a file call's waits on the guest's agent: in all they may last the
// call's FileTimeout plus a second for each fileMinRate bytes moved, and past that the
// call's context ends. The waits on the caller (for the body of a write, or to take a
// read's bytes) are the caller's own and are not counted: a slow caller is no slow guest.
type agentClock struct {
	wait   time.Duration
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	timer  *time.Timer
	since  time.Time     // when the wait on the agent in progress began; zero between waits
	spent  time.Duration // the waits on the agent before it
	moved  int64         // bytes moved to or from the agent
	late   *apiError     // the call's 504, once the bound ended it
	done   bool
}

// boundFileCall answers ctx bounded by a new agentClock, which counts a wait on the agent
// from now (the call's request). Call the clock's stop once the call is done.
func (s *Server) boundFileCall(ctx context.Context) (context.Context, *agentClock) {
	ctx, cancel := context.WithCancelCause(ctx)
	c := &agentClock{wait: cmp.Or(s.FileTimeout, DefaultFileTimeout), cancel: cancel}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.since = time.Now()
	c.timer = time.AfterFunc(c.wait, c.expire)
	return ctx, c
}

func (c *agentClock) budget() time.Duration {
	return c.wait + time.Duration(c.moved)*time.Second/fileMinRate
}

// expire ends the call once its waits on the agent are past its budget. The timer may fire
// for a wait that has ended since, or with budget added since: it checks, and re-arms.
func (c *agentClock) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done || c.since.IsZero() || c.late != nil {
		return
	}
	budget := c.budget()
	if left := budget - c.spent - time.Since(c.since); left > 0 {
		c.timer.Reset(left)
		return
	}
	c.late = errGuestTimeout("the guest's agent", max(time.Second, budget.Round(time.Second)))
	c.cancel(c.late)
}

// toAgent credits n bytes moved and starts a wait on the agent.
func (c *agentClock) toAgent(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.moved += int64(n)
	if c.done || !c.since.IsZero() {
		return
	}
	c.since = time.Now()
	c.timer.Reset(max(0, c.budget()-c.spent))
}

// toCaller credits n bytes moved and ends the wait on the agent in progress.
func (c *agentClock) toCaller(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.moved += int64(n)
	if !c.since.IsZero() {
		c.spent += time.Since(c.since)
		c.since = time.Time{}
	}
	c.timer.Stop()
}

// stop ends the clock, and the call's context.
func (c *agentClock) stop() {
	c.mu.Lock()
	c.done = true
	c.timer.Stop()
	c.mu.Unlock()
	c.cancel(nil)
}

// failed answers the error of the call that failed with err: its 504 when its bound ended it,
// else the agent's (agentError).
func (c *agentClock) failed(ctx context.Context, s *Server, err error) error {
	if late := c.lateError(); late != nil {
		return late
	}
	return s.agentError(ctx, err)
}

// lateError is the call's 504 if its bound ended it, else nil.
func (c *agentClock) lateError() *apiError {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.late
}

// clockedAnswer is a read's answer from the agent: the time in its Read is the agent's.
type clockedAnswer struct {
	io.Reader
	c *agentClock
}

func (a clockedAnswer) Read(p []byte) (int, error) {
	a.c.toAgent(0)
	n, err := a.Reader.Read(p)
	a.c.toCaller(n)
	return n, err
}

// clockedBody is a write's body, read from the caller while the agent's client sends it: the
// time in its Read is the caller's, the time between reads (sending what was read, then
// waiting for the answer) the agent's.
type clockedBody struct {
	io.Reader
	c *agentClock
}

func (b clockedBody) Read(p []byte) (int, error) {
	b.c.toCaller(0)
	n, err := b.Reader.Read(p)
	b.c.toAgent(n)
	return n, err
}

// guestAgent answers the agent of a running session of project p, and records the call as
// the session's activity (its last_activity_at), as exec does: every file call and PTY is use.
// kind is the calls' (nodeapi.AgentKindFiles, AgentKindPTY): a node in process counts a
// refusal under it.
func (s *Server) guestAgent(ctx context.Context, p store.Project, id, kind string) (*session.Session, *agent.Client, error) {
	sess, err := s.loadSession(ctx, p, id)
	if err != nil {
		return nil, nil, err
	}
	if sess.State != session.Running {
		return nil, nil, errNeedsRunning(opFiles, sess.State)
	}
	g, err := s.guests()
	if err != nil {
		return nil, nil, err
	}
	if err := s.Store.Touch(ctx, sess.ProjectID, sess.ID); err != nil {
		return nil, nil, err
	}
	c, err := g.Agent(nodeapi.WithAgentKind(ctx, kind), sess)
	if err != nil {
		return nil, nil, s.errNode(ctx, "node_error", "the node could not reach the guest", err)
	}
	return sess, c, nil
}

func filePath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", errInvalid("path", "the path query parameter is required")
	}
	if len(p) > 4096 || strings.ContainsRune(p, 0) {
		return "", errInvalid("path", "not a usable path")
	}
	return p, nil
}

// agentError maps an agent's error answer (404, 400, 413) to the API's, and the node's
// (its proxy's) as errNode does.
func (s *Server) agentError(ctx context.Context, err error) error {
	var ae *agent.Error
	if errors.As(err, &ae) && ae.Code != nodeapi.CodeInvalidState {
		switch ae.Status {
		case 404:
			return &apiError{Status: 404, Type: "not_found", Code: "not_found", Message: ae.Message}
		case 400, 409:
			return errInvalid("path", "%s", ae.Message)
		case 413:
			return &apiError{Status: 413, Type: "invalid_request", Code: "too_large", Message: ae.Message}
		}
	}
	return s.errNode(ctx, "node_error", "the guest's agent failed", err)
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	path, err := filePath(r)
	if err != nil {
		return err
	}
	_, c, err := s.guestAgent(r.Context(), p, r.PathValue("id"), nodeapi.AgentKindFiles)
	if err != nil {
		return err
	}
	ctx, clock := s.boundFileCall(r.Context())
	defer clock.stop()
	// The bound above counts the waits on the agent alone: a caller that stays connected but
	// takes none of the answer for WriteStall ends the read instead, which would otherwise
	// hold the call (its slot among the project's file calls, the node's connection and the
	// agent's) for as long as the caller stayed.
	sw := stallwrite.New(w, s.WriteStall)
	defer sw.Close()
	w = sw
	if r.URL.Query().Get("list") == "1" {
		entries, err := c.ListDir(ctx, path)
		if err != nil {
			return clock.failed(r.Context(), s, err)
		}
		writeJSON(w, 200, session.NewList(entries, ""))
		return nil
	}
	rc, err := c.OpenFile(ctx, path)
	if err != nil {
		return clock.failed(r.Context(), s, err)
	}
	defer rc.Close()
	clock.toCaller(0)
	w.Header().Set("Content-Type", "application/octet-stream")
	if _, err := io.Copy(w, clockedAnswer{Reader: rc, c: clock}); err != nil {
		if late := clock.lateError(); late != nil {
			err = late
		}
		s.log.WarnContext(r.Context(), "files: a read broke off", "session", r.PathValue("id"), "err", err)
		// The answer's 200 is out: it ends broken (net/http's abort, not a crash), so that the
		// caller does not take the bytes it got for the whole file.
		panic(http.ErrAbortHandler)
	}
	return nil
}

// errFileTooLarge is the 413 of a file written past MaxFileBytes.
func errFileTooLarge() error {
	return &apiError{Status: 413, Type: "invalid_request", Code: "too_large", Message: fmt.Sprintf("files are at most %d bytes", MaxFileBytes)}
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	path, err := filePath(r)
	if err != nil {
		return err
	}
	if r.ContentLength > MaxFileBytes {
		return errFileTooLarge()
	}
	_, c, err := s.guestAgent(r.Context(), p, r.PathValue("id"), nodeapi.AgentKindFiles)
	if err != nil {
		return err
	}
	ctx, clock := s.boundFileCall(r.Context())
	defer clock.stop()
	if err := c.WriteFile(ctx, path, clockedBody{Reader: http.MaxBytesReader(w, r.Body, MaxFileBytes), c: clock}, 0o644); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errFileTooLarge()
		}
		return clock.failed(r.Context(), s, err)
	}
	w.WriteHeader(204)
	return nil
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	path, err := filePath(r)
	if err != nil {
		return err
	}
	_, c, err := s.guestAgent(r.Context(), p, r.PathValue("id"), nodeapi.AgentKindFiles)
	if err != nil {
		return err
	}
	ctx, clock := s.boundFileCall(r.Context())
	defer clock.stop()
	if err := c.DeleteFile(ctx, path); err != nil {
		return clock.failed(r.Context(), s, err)
	}
	w.WriteHeader(204)
	return nil
}

// ptyHandshakeTimeout bounds the opening of a PTY by the guest's agent (which answers as
// soon as its shell started).
const ptyHandshakeTimeout = 30 * time.Second

// defaultPTYInputWait bounds how long a frame of a PTY's input waits to go to the guest's
// agent, which takes none while the terminal's program reads none: past it, the PTY ends (as
// when its caller leaves: the program is killed). Input is queued on the way first (the
// agent's frame, the terminal's buffer, the sockets' buffers: a megabyte or more), which no
// typing and few pastes fill, so a PTY ends only once that much input waited this long on a
// program that took (almost) none of it: the sockets let a blocked write on only once a good
// part of their buffer was taken, so a program that takes a large paste more slowly than
// some 20 kB/s ends it too. The bound is needed, and is not the guest's business alone:
// while a frame waits, the gateway reads its caller no more (the input has nowhere to go but
// the gateway's memory), so it would not see the caller leave, and a guest's agent that took
// no input would hold the PTY, its slot among the project's, and the node's connection for
// good.
const defaultPTYInputWait = time.Minute

// pty bridges a caller's WebSocket to the guest agent's PTY. Every frame from the caller is
// activity. Closing either side closes the other; the session itself is unchanged. A side
// that takes none of what the other sends ends the PTY too, as if it left: the guest, input
// for ptyInputWait; the caller, output for WriteStall.
func (s *Server) pty(w http.ResponseWriter, r *http.Request, p store.Project) error {
	q := r.URL.Query()
	dims, err := ptySize(r)
	if err != nil {
		return err
	}
	sess, c, err := s.guestAgent(r.Context(), p, r.PathValue("id"), nodeapi.AgentKindPTY)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	// The handshake ends with the caller's request too, and within ptyHandshakeTimeout: the
	// agent is the guest's, and one that never answers held this handler, and the node's
	// proxy, for as long as the gateway ran (the PTY itself, once open, ends with s.ctx).
	hctx, hcancel := context.WithTimeout(ctx, ptyHandshakeTimeout)
	stop := context.AfterFunc(r.Context(), hcancel)
	up, _, err := c.PTY(hctx, dims[0], dims[1], q.Get("command"))
	stop()
	hcancel()
	if ae := nodePolicyRefusal(err); ae != nil {
		// The runtime decision point refused the PTY's command (or killed the session for it).
		return policyAnswer(ae)
	}
	if err != nil {
		return s.agentError(r.Context(), err)
	}
	defer up.CloseNow()
	down, err := websocket.Accept(w, r, ptyAcceptOptions(r))
	if err != nil {
		return nil // Accept has answered the caller
	}
	defer down.CloseNow()
	up.SetReadLimit(1 << 20)
	down.SetReadLimit(1 << 20)
	errc := make(chan error, 2)
	// Input that the guest does not take within ptyInputWait ends the PTY: the copy to the
	// agent blocked on it would otherwise hold the PTY, which reads its caller no more and
	// so would not see it leave, for as long as the agent chose.
	go func() {
		errc <- fmt.Errorf("its input: %w", pump(ctx, down, up, func() { s.Guests.Touch(sess) }, s.ptyInputWait))
	}()
	// Output that the caller does not take within WriteStall ends the PTY too: a caller that
	// stays connected and reads no more would otherwise hold it (its slot among the project's
	// PTYs, the node's connection and the agent's, the program in the guest) for as long as it
	// stayed. Closing the guest's side kills the program, as when the caller leaves.
	go func() { errc <- fmt.Errorf("its output: %w", pump(ctx, up, down, nil, s.WriteStall)) }()
	if err := <-errc; errors.Is(err, errFrameStalled) {
		s.log.WarnContext(r.Context(), "pty: ended", "session", sess.ID, "err", err)
	}
	cancel()
	_ = down.Close(websocket.StatusNormalClosure, "")
	return nil
}

// ptySize is a PTY's columns and rows, from its query (80×24 by default).
func ptySize(r *http.Request) ([2]int, error) {
	q := r.URL.Query()
	dims := [2]int{80, 24}
	for i, name := range []string{"cols", "rows"} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1000 {
				return dims, errInvalid(name, "must be an integer 1–1000, got %q", v)
			}
			dims[i] = n
		}
	}
	return dims, nil
}

// errFrameStalled is pump's error for a frame that its destination did not take in time.
var errFrameStalled = errors.New("a frame of the PTY was not taken")

// pump copies frames from src to dst until either fails (it answers that error, never nil),
// calling each (if set) per frame; with wait above 0, a frame that dst does not take within
// wait ends it (and dst: see websocket.Conn.Write) with errFrameStalled.
func pump(ctx context.Context, src, dst *websocket.Conn, each func(), wait time.Duration) error {
	for {
		typ, b, err := src.Read(ctx)
		if err != nil {
			return err
		}
		if each != nil {
			each()
		}
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if wait > 0 {
			wctx, cancel = context.WithTimeout(ctx, wait)
		}
		err = dst.Write(wctx, typ, b)
		stalled := ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded)
		cancel()
		if err != nil && stalled {
			return fmt.Errorf("%w within %s: %w", errFrameStalled, wait, err)
		}
		if err != nil {
			return err
		}
	}
}
