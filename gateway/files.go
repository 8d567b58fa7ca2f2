package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"wb/agent"
	"wb/node/nodeapi"
	"wb/session"
	"wb/store"
)

// MaxFileBytes bounds one file upload.
const MaxFileBytes = 100 << 20

// guestAgent answers the agent of a running session of project p, and records the call as
// the session's activity (its last_activity_at), as exec does: every file call and PTY is use.
func (s *Server) guestAgent(ctx context.Context, p store.Project, id string) (*session.Session, *agent.Client, error) {
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
	c, err := g.Agent(ctx, sess)
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
	_, c, err := s.guestAgent(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if r.URL.Query().Get("list") == "1" {
		entries, err := c.ListDir(r.Context(), path)
		if err != nil {
			return s.agentError(r.Context(), err)
		}
		writeJSON(w, 200, session.NewList(entries, ""))
		return nil
	}
	rc, err := c.OpenFile(r.Context(), path)
	if err != nil {
		return s.agentError(r.Context(), err)
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = io.Copy(w, rc)
	return nil
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	path, err := filePath(r)
	if err != nil {
		return err
	}
	if r.ContentLength > MaxFileBytes {
		return &apiError{Status: 413, Type: "invalid_request", Code: "too_large", Message: fmt.Sprintf("files are at most %d bytes", MaxFileBytes)}
	}
	_, c, err := s.guestAgent(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := c.WriteFile(r.Context(), path, http.MaxBytesReader(w, r.Body, MaxFileBytes), 0o644); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{Status: 413, Type: "invalid_request", Code: "too_large", Message: fmt.Sprintf("files are at most %d bytes", MaxFileBytes)}
		}
		return s.agentError(r.Context(), err)
	}
	w.WriteHeader(204)
	return nil
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	path, err := filePath(r)
	if err != nil {
		return err
	}
	_, c, err := s.guestAgent(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := c.DeleteFile(r.Context(), path); err != nil {
		return s.agentError(r.Context(), err)
	}
	w.WriteHeader(204)
	return nil
}

// ptyHandshakeTimeout bounds the opening of a PTY by the guest's agent (which answers as
// soon as its shell started).
const ptyHandshakeTimeout = 30 * time.Second

// defaultPTYInputWait bounds how long a frame of a PTY's input waits to go to the guest's
// agent, which takes none while the terminal's program reads none: a megabyte or so of
// input can be queued on the way first, which no typing and few pastes fill.
const defaultPTYInputWait = time.Minute

// pty bridges a caller's WebSocket to the guest agent's PTY. Every frame from the caller is
// activity. Closing either side closes the other; the session itself is unchanged.
func (s *Server) pty(w http.ResponseWriter, r *http.Request, p store.Project) error {
	q := r.URL.Query()
	dims := [2]int{80, 24}
	for i, name := range []string{"cols", "rows"} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1000 {
				return errInvalid(name, "must be an integer 1–1000, got %q", v)
			}
			dims[i] = n
		}
	}
	sess, c, err := s.guestAgent(r.Context(), p, r.PathValue("id"))
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
	if ae := (*agent.Error)(nil); errors.As(err, &ae) && ae.Status == http.StatusForbidden {
		// The runtime decision point refused the PTY's command (or killed the session for it).
		return &apiError{Status: 403, Type: "denied", Code: "policy_violation", Message: ae.Message}
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
	go func() { errc <- pump(ctx, down, up, func() { s.Guests.Touch(sess) }, s.ptyInputWait) }()
	go func() { errc <- pump(ctx, up, down, nil, 0) }()
	<-errc
	cancel()
	_ = down.Close(websocket.StatusNormalClosure, "")
	return nil
}

// pump copies frames from src to dst, calling each (if set) per frame; with wait above 0, a
// frame that dst does not take within wait ends it (and dst: see websocket.Conn.Write).
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
		cancel()
		if err != nil {
			return err
		}
	}
}
