package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/internal/stallwrite"
	"wb/node/nodeapi"
	"wb/session"
)

// Handler serves the node's API to the control plane (its types are package nodeapi):
// provisioning and the guest controls, and /v1/sessions/{id}/agent/…, a reverse proxy to the
// session's agent (exec, files, PTY over WebSocket) that counts every call as activity. Every
// request but /healthz carries token as a bearer token. Errors answer nodeapi.ErrorBody.
func (n *Node) Handler(token string) http.Handler {
	m := http.NewServeMux()
	m.HandleFunc(nodeapi.RouteHealth, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, 200, nodeapi.Health{Status: "ok"})
	})
	m.HandleFunc(nodeapi.RouteProvision, n.apiProvision)
	m.HandleFunc(nodeapi.RouteSessionAction, n.apiAction)
	m.HandleFunc(nodeapi.RouteDeleteSnapshot, func(w http.ResponseWriter, r *http.Request) {
		if err := n.DeleteSnapshot(r.Context(), r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(204)
	})
	m.HandleFunc(nodeapi.RouteAgent, n.apiAgent)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, &nodeapi.Error{Status: 404, Code: nodeapi.CodeNoRoute, Message: "node: no route " + r.Method + " " + r.URL.Path})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if r.URL.Path != nodeapi.PathHealth && subtle.ConstantTimeCompare([]byte(key), []byte(token)) != 1 {
			writeAPIError(w, &nodeapi.Error{Status: 401, Code: nodeapi.CodeUnauthenticated, Message: "node: bad or missing token"})
			return
		}
		if !canonicalPath(r.URL) {
			// Refused, not redirected to its cleaned form (the mux's way): the node's callers
			// send canonical paths, and the agent's routes are the node's to tell apart.
			writeAPIError(w, &nodeapi.Error{Status: 400, Code: nodeapi.CodeInvalidRequest, Param: "path",
				Message: fmt.Sprintf("node: the path %q is not in its canonical form", clip(r.URL.EscapedPath(), 256))})
			return
		}
		m.ServeHTTP(w, r)
	})
}

// canonicalPath reports whether u's path is in its canonical form: no byte percent-encoded
// (the node's paths need none), no empty, "." or ".." segment, no trailing slash but the root's or an
// agent route's (nodeapi.RouteAgent), whose own path is agentPath. Another spelling of a
// path would be read one way by the node's checks and perhaps another by the guest's agent.
func canonicalPath(u *url.URL) bool {
	if u.EscapedPath() != u.Path || u.Opaque != "" || !strings.HasPrefix(u.Path, "/") {
		return false
	}
	p := u.Path
	if strings.HasSuffix(p, "/agent/") {
		p = strings.TrimSuffix(p, "/")
	}
	return p == "/" || path.Clean(p) == p
}

// agentPath is the path of r, a request of nodeapi.RouteAgent, to the session's agent: what
// follows /v1/sessions/{id}/agent. The mux and canonicalPath let only canonical paths here.
func agentPath(r *http.Request) string {
	rest, _ := strings.CutPrefix(r.URL.Path, "/v1/sessions/")
	_, rest, _ = strings.Cut(rest, "/") // the session's id, one segment
	rest, _ = strings.CutPrefix(rest, "agent")
	return rest
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeAPIError(w http.ResponseWriter, e *nodeapi.Error) {
	writeJSON(w, e.Status, nodeapi.ErrorBody{Error: e})
}

// writeError answers err with the status and code its kind has: a body or field the node
// cannot use is a 400, a session it holds no guest for a 404, a state that does not allow
// the operation a 409, anything else the node's own failure, a 500.
func writeError(w http.ResponseWriter, err error) {
	writeAPIError(w, apiError(err))
}

// apiError is err as the node's API answers it (see writeError).
func apiError(err error) *nodeapi.Error {
	var (
		ng *NoGuestError
		se *StateError
		fe *session.FieldError
		ne *nodeapi.Error
	)
	e := &nodeapi.Error{Status: 500, Code: nodeapi.CodeInternal, Message: err.Error()}
	switch {
	case errors.As(err, &ne):
		e = ne
	case errors.As(err, &ng):
		e.Status, e.Code = 404, nodeapi.CodeNotFound
	case errors.As(err, &se):
		e.Status, e.Code = 409, nodeapi.CodeInvalidState
	case errors.As(err, &fe):
		e.Status, e.Code, e.Param = 400, nodeapi.CodeInvalidRequest, fe.Field
	case errors.Is(err, hypervisor.ErrLayerTooLarge):
		// What the guest holds refuses it, as a state would: the caller's to change.
		e.Status, e.Code = 409, nodeapi.CodeInvalidState
	}
	return e
}

// decodeBody reads a JSON request body of at most limit bytes into v; what it cannot read is
// a 400.
func decodeBody(r *http.Request, limit int64, v any) error {
	if err := json.NewDecoder(io.LimitReader(r.Body, limit)).Decode(v); err != nil {
		return &nodeapi.Error{Status: 400, Code: nodeapi.CodeInvalidRequest, Param: "body", Message: "node: cannot read the request body: " + err.Error()}
	}
	return nil
}

// apiProvision starts a guest in the background: the node reports the outcome through Redis.
func (n *Node) apiProvision(w http.ResponseWriter, r *http.Request) {
	var s nodeapi.ProvisionRequest
	if err := decodeBody(r, 1<<20, &s); err != nil {
		writeError(w, err)
		return
	}
	// Checked before the 202: what the start would refuse later is the caller's mistake, and a
	// failure it wrote to Redis would be a session's of no id.
	switch {
	case !session.ValidID("sess_", s.ID):
		writeError(w, &session.FieldError{Field: "id", Message: fmt.Sprintf("%q is not a session id (sess_ and 18 letters or digits)", clip(s.ID, 64))})
		return
	case s.Template == "":
		writeError(w, &session.FieldError{Field: "template", Message: "session " + s.ID + " names no template"})
		return
	}
	if !n.goBackground(func() { _ = n.Provision(n.ctx, n.Info, &s) }) {
		writeError(w, &nodeapi.Error{Status: 503, Code: nodeapi.CodeUnavailable, Message: "node: shutting down; it starts no guest for session " + s.ID})
		return
	}
	writeJSON(w, 202, nodeapi.ProvisionAccepted{SessionID: s.ID})
}

func (n *Node) apiAction(w http.ResponseWriter, r *http.Request) {
	id, action, _ := strings.Cut(r.PathValue("id"), ":")
	ref := &session.Session{ID: id}
	ctx := r.Context()
	var err error
	switch action {
	case nodeapi.ActionPause:
		err = n.Pause(ctx, ref)
	case nodeapi.ActionResume:
		err = n.Resume(ctx, ref)
	case nodeapi.ActionTouch:
		n.Touch(ref)
	case nodeapi.ActionRetime:
		var req nodeapi.RetimeRequest
		if err = decodeBody(r, 1<<16, &req); err == nil {
			err = n.Retime(ctx, &session.Session{ID: id, IdleTimeoutS: req.IdleTimeoutS, MaxLifetimeS: req.MaxLifetimeS})
		}
	case nodeapi.ActionStop:
		var req nodeapi.StopRequest
		if err = decodeBody(r, 1<<16, &req); err != nil {
			break
		}
		if req.SaveAs == "" {
			err = n.Stop(ctx, stopped(id, req))
			break
		}
		if !session.ValidID("snap_", req.SaveAs) {
			// Refused before the stop: a stop that could not save would end the session all the same.
			err = &session.FieldError{Field: "save_as", Message: fmt.Sprintf("%q is not a snapshot id (snap_ and 18 letters or digits)", req.SaveAs)}
			break
		}
		var info hypervisor.SnapshotInfo
		if info, err = n.StopSaving(ctx, stopped(id, req), req.SaveAs); err == nil {
			writeJSON(w, 200, nodeapi.SnapshotResult{Memory: info.Memory, SizeBytes: info.SizeBytes, RootImage: info.RootImage})
			return
		}
	case nodeapi.ActionSnapshot:
		var req nodeapi.SnapshotRequest
		if err = decodeBody(r, 1<<16, &req); err != nil {
			break
		}
		if !validName(req.SnapshotID) {
			err = &session.FieldError{Field: "snapshot_id", Message: fmt.Sprintf("%q is not a usable snapshot id (1–128 letters, digits, _ or -)", req.SnapshotID)}
			break
		}
		var info hypervisor.SnapshotInfo
		if info, err = n.Snapshot(ctx, ref, req.SnapshotID, req.IncludeMemory); err == nil {
			writeJSON(w, 200, nodeapi.SnapshotResult{Memory: info.Memory, SizeBytes: info.SizeBytes, RootImage: info.RootImage})
			return
		}
	default:
		err = &nodeapi.Error{Status: 404, Code: nodeapi.CodeNoRoute, Message: fmt.Sprintf("node: unknown action %q", action)}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(204)
}

// stopped is the session a StopRequest describes, as Node.Stop takes it.
func stopped(id string, req nodeapi.StopRequest) *session.Session {
	s := &session.Session{ID: id, ProjectID: req.ProjectID}
	if req.Reason != "" {
		s.StateReason = &req.Reason
	}
	if req.Rule != "" {
		s.Rule = &req.Rule
	}
	return s
}

// apiAgent proxies to the session's agent while it runs.
func (n *Node) apiAgent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sub := agentPath(r)
	sw := &statusWriter{ResponseWriter: w}
	w = sw
	var ended *execEnd // an exec's, once its answer is under way
	defer func() {
		status := sw.status
		if s := ended.load(); s != 0 {
			status = s // the node's line that ended the answer, after its 200
		}
		n.Metrics.agentRequest(agentKind(r.Method, sub), status)
	}()
	l, _, direct, err := n.runningGuest(&session.Session{ID: id})
	exec := r.Method == http.MethodPost && sub == "/v1/exec"
	pty := r.Method == http.MethodGet && sub == "/v1/pty"
	if err == nil && direct && !exec {
		err = errDirect(&session.Session{ID: id}, "files, PTYs and agent calls")
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if !pty {
		// A caller that stays connected but takes none of the answer for WriteStall ends the
		// call: the proxy's write fails, and it closes the agent's connection, which kills an
		// exec's processes as its timeout does. (A PTY's WebSocket is not written through w,
		// but through the connection it hijacks.)
		sw := stallwrite.New(w, n.WriteStall)
		defer func() {
			sw.Close()
			if !sw.Stalled() {
				return
			}
			if exec {
				n.Logger.Warn("exec: its caller took none of the exec's answer within the stall; the exec is ended and its processes killed",
					"session", id, "stall", n.WriteStall)
				return
			}
			n.Logger.Warn("agent call: its caller took none of the answer within the stall; the call is ended",
				"session", id, "method", r.Method, "path", r.URL.Path, "stall", n.WriteStall)
		}()
		w = sw
	} else {
		// A PTY's output that its caller does not take within WriteStall ends the PTY, as
		// its caller's leaving does: the proxy's copy to the caller fails, and it closes the
		// agent's connection, which kills the PTY's program. The copy would otherwise block
		// for as long as the caller stayed, holding the proxy's goroutines, both connections
		// and the program.
		hj := stallwrite.NewHijacker(w, n.WriteStall)
		defer func() {
			if hj.Stalled() {
				n.Logger.Warn("pty: its caller took none of the PTY's output within the stall; the PTY is ended",
					"session", id, "stall", n.WriteStall)
			}
		}()
		w = hj
	}
	if exec {
		// The runtime decision point sees every command before the guest runs it.
		body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if err != nil {
			writeAPIError(w, &nodeapi.Error{Status: 400, Code: nodeapi.CodeInvalidRequest, Param: "body", Message: "node: cannot read the request body: " + err.Error()})
			return
		}
		var req agent.ExecRequest
		decoded := json.Unmarshal(body, &req) == nil
		l.mu.Lock()
		err = n.checkExec(r.Context(), l, req.Argv)
		ref, guest := l.g.Template, l.g.GuestID
		l.mu.Unlock()
		if err != nil {
			writeRuntimeRefusal(w, err)
			return
		}
		defer n.Metrics.execStarted()()
		ended = &execEnd{}
		r = r.WithContext(context.WithValue(r.Context(), execEndKey{}, ended))
		if direct {
			// Its one exec, answered here as its agent would (it has none).
			ctx, _, cancel := n.execBackstop(r.Context(), req.TimeoutS)
			defer cancel()
			tpl, err := n.template(ref)
			if err != nil {
				writeError(w, err)
				return
			}
			if l.direct.Used() {
				writeError(w, errDirect(&session.Session{ID: id}, "its run's exec ran already"))
				return
			}
			ooms, counted := n.oomsBefore(ctx, l, guest)
			l.direct.ServeExec(w, r.WithContext(ctx), body, directFork(tpl, req.Argv, req.Env), func() {
				if counted {
					n.endIfOOM(ctx, l, guest, ooms)
				}
			})
			return
		}
		// As Node.Exec does: an OOM kill during the exec fails the session before its result
		// goes out.
		if ooms, counted := n.oomsBefore(r.Context(), l, guest); counted {
			ctx := r.Context()
			check := &resultCheck{check: func() { n.endIfOOM(ctx, l, guest, ooms) }}
			defer check.run() // the answer had no result line
			r = r.WithContext(context.WithValue(ctx, resultCheckKey{}, check))
		}
		// A run's code goes to the guest's waiting interpreter, as in process (Node.Exec). A
		// body the agent would refuse is passed as it came, for the agent's answer.
		if decoded && req.Runner == "" {
			if req.Runner = n.runnerFor(ref, req.Argv, req.Env); req.Runner != "" {
				if b, err := json.Marshal(req); err == nil {
					body = b
				}
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		// As Node.Exec does: past its timeout and a grace of its agent's time, the exec ends
		// (execBackstop); explainedExec tells its clock when the exec waits on the agent.
		ctx, _, cancel := n.execBackstop(r.Context(), req.TimeoutS)
		defer cancel()
		r = r.WithContext(ctx)
	}
	if pty {
		// A PTY's command is an exec like any other.
		l.mu.Lock()
		err := n.checkPTY(r.Context(), l, r.URL.Query().Get("command"))
		l.mu.Unlock()
		if err != nil {
			writeRuntimeRefusal(w, err)
			return
		}
	}
	l.mu.Lock()
	proxy := l.proxy
	if proxy == nil {
		// A write to the guest's agent that it takes none of within WriteStall fails, and
		// the call ends: a PTY's input that a hostile agent takes none of would otherwise
		// block the proxy's copy of it, which then read its caller no more and saw it not
		// leave, holding the proxy's goroutines and both connections for as long as the
		// guest ran.
		dial := n.agentDial(l.g.GuestID)
		bounded := func(ctx context.Context) (net.Conn, error) {
			c, err := dial(ctx)
			if err != nil {
				return nil, err
			}
			return stallwrite.NewConn(c, n.WriteStall), nil
		}
		proxy = agentProxy(bounded, func(ctx context.Context, err error) error { return n.whyExecBroke(ctx, l, err) },
			n.Logger.With("session", id))
		l.proxy = proxy
	}
	l.mu.Unlock()
	r.Header.Del("Authorization")
	// The agent answers an exec while its request may still be arriving; without full duplex
	// the server would close the request body once the answer starts, and the proxy would cut
	// the agent's connection mid-answer.
	_ = http.NewResponseController(w).EnableFullDuplex()
	proxy.ServeHTTP(w, r)
}

// resultCheck is a check an exec's answer through the node's proxy has done once, before its
// result line goes out (explainedExec), or when the answer ended without one (the guest's
// agent went, perhaps with the guest), so that what the check does is done before the caller
// can read the result.
type resultCheck struct {
	once  sync.Once
	check func()
}

func (c *resultCheck) run() {
	if c != nil {
		c.once.Do(c.check)
	}
}

// resultCheckKey is the context key of an exec's resultCheck through the node's proxy
// (apiAgent).
type resultCheckKey struct{}

// execEnd is the status of the node's own line that ended an exec's answer through its proxy
// (explainedExec.end), 0 for none: the answer's 200 went out before the line, and apiAgent
// counts the exec by the line's status.
type execEnd struct{ status atomic.Int32 }

// load answers the status (0 for none, or for a nil e).
func (e *execEnd) load() int {
	if e == nil {
		return 0
	}
	return int(e.status.Load())
}

// execEndKey is the context key of an exec's execEnd through the node's proxy (apiAgent).
type execEndKey struct{}

// writeRuntimeRefusal answers a command the runtime decision point did not allow: 403
// policy_violation when a policy killed the session, 403 policy_error when the session's
// policy could not decide (the command fails closed).
func writeRuntimeRefusal(w http.ResponseWriter, err error) {
	writeAPIError(w, runtimeRefusal(err))
}

// runtimeRefusal is the answer to a command the runtime decision point did not allow.
func runtimeRefusal(err error) *nodeapi.Error {
	var ke *KilledError
	if errors.As(err, &ke) {
		return &nodeapi.Error{Status: 403, Code: nodeapi.CodePolicyViolation, Message: ke.Error(), Param: ke.Rule}
	}
	return &nodeapi.Error{Status: 403, Code: nodeapi.CodePolicyError, Message: err.Error()}
}

// agentProxy forwards /v1/sessions/{id}/agent/<rest> to /<rest> on the agent's connection
// (dial), streaming (exec output is flushed as it comes) and upgrading to WebSocket for the PTY.
func agentProxy(dial func(context.Context) (net.Conn, error), whyBroke func(context.Context, error) error, log *slog.Logger) *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		// The agent is the guest's: Go's default would let it make the node, and the gateway
		// it passes them on to, hold 10 MiB of headers for every answer.
		MaxResponseHeaderBytes: agent.MaxAnswerHeaderBytes,
		// The agent is asked for no encoding (see Rewrite), and one it sends anyway is refused.
		DisableCompression: true,
	}
	return &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "agent"
			pr.Out.URL.Path, pr.Out.URL.RawPath = agentPath(pr.In), ""
			// The node reads the agent's answers (an exec's lines, an error's code) before
			// passing them on: an encoded one would pass its checks as bytes they cannot read
			// and be decoded past them by the caller (a gateway's transport asks for gzip).
			pr.Out.Header.Del("Accept-Encoding")
		},
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode >= 300 && resp.StatusCode < 400 {
				// The agent sends no redirect, and one passed on would have a client that
				// follows it (a gateway from before it followed none) resend its request,
				// the node token with it, to another session's agent here or to any URL.
				refuseAnswer(resp, fmt.Sprintf("node: the guest's agent answered %d, a redirect, which the node does not pass on", resp.StatusCode))
				return nil
			}
			if ce := resp.Header.Get("Content-Encoding"); ce != "" {
				// Asked for none (see Rewrite): the node's checks cannot read it.
				refuseAnswer(resp, fmt.Sprintf("node: the guest's agent answered %d encoded (%s), which the node does not pass on", resp.StatusCode, clip(ce, 64)))
				return nil
			}
			if resp.StatusCode >= 400 {
				guestRefusalAnswer(resp)
				return nil
			}
			if resp.Request.URL.Path == "/v1/exec" && resp.StatusCode != http.StatusOK {
				// The node checks the lines of an exec's 200 (explainedExec), and its callers
				// take any 2xx for one: another status would pass the agent's lines on
				// unchecked, a forged error line for the node's policy kill.
				refuseAnswer(resp, fmt.Sprintf("node: the guest's agent answered its exec %d, not 200", resp.StatusCode))
				return nil
			}
			if resp.StatusCode == http.StatusOK && resp.Request.URL.Path == "/v1/exec" {
				clock, _ := resp.Request.Context().Value(execClockKey{}).(*execClock)
				check, _ := resp.Request.Context().Value(resultCheckKey{}).(*resultCheck)
				clock.toCaller() // the answer's status goes out first
				resp.Body = newExplainedExec(resp.Request.Context(), resp.Body, whyBroke, clock, check)
				// The node may end the answer with its own line in place of the agent's rest
				// (explainedExec.end): a length of the agent's would cut that line off, or
				// the caller would read the answer as broken before it.
				resp.ContentLength = -1
				resp.Header.Del("Content-Length")
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// An exec's answer may break before its status: the agent sends that with the
			// command's first output or its result. The guest's end is then the refusal itself.
			if cause := context.Cause(r.Context()); errors.Is(cause, errExecUnanswered) {
				writeAPIError(w, &nodeapi.Error{Status: 502, Code: nodeapi.CodeAgentUnreachable, Message: cause.Error()})
				return
			}
			var se *StateError
			if r.URL.Path == "/v1/exec" && errors.As(whyBroke(r.Context(), err), &se) {
				writeAPIError(w, apiError(se))
				return
			}
			writeAPIError(w, &nodeapi.Error{Status: 502, Code: nodeapi.CodeAgentUnreachable, Message: "node: the guest's agent did not answer: " + err.Error()})
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn), // an answer that broke off
	}
}

// fromGuest is an error answer of the guest's agent as the node passes it on, and whether it
// changed. One that could pass for a refusal of the node's own is the guest's error instead,
// a 502 guest_error quoting it: a 403, which the node's callers take for its runtime policy's
// kill (a hostile guest would have its sessions look policy-killed), or a code the node alone
// answers (invalid_state, which callers take for the guest's end). Any other passes as it
// came (a file not found, a body the agent cannot use).
func fromGuest(e *nodeapi.Error) (*nodeapi.Error, bool) {
	switch {
	case e.Status == http.StatusForbidden:
	case e.Code == nodeapi.CodePolicyViolation, e.Code == nodeapi.CodePolicyError, e.Code == nodeapi.CodeInvalidState,
		e.Code == nodeapi.CodeAgentUnreachable, e.Code == nodeapi.CodeGuestError, e.Code == nodeapi.CodeUnavailable,
		e.Code == nodeapi.CodeUnauthenticated, e.Code == nodeapi.CodeNoRoute:
	default:
		return e, false
	}
	return &nodeapi.Error{Status: http.StatusBadGateway, Code: nodeapi.CodeGuestError,
		Message: fmt.Sprintf("node: the guest's agent answered %d %s: %s", e.Status, clip(e.Code, 64), clip(e.Message, 512))}, true
}

// fromGuestAgent is fromGuest for an *agent.Error, as the node's callers in process read the
// agent's answers (Node.Exec, Local.Agent).
func fromGuestAgent(ae *agent.Error) *agent.Error {
	e, changed := fromGuest(&nodeapi.Error{Status: ae.Status, Code: ae.Code, Message: ae.Message, Param: ae.Param})
	if !changed {
		return ae
	}
	return &agent.Error{Status: e.Status, Code: e.Code, Message: e.Message}
}

// guestRefusalAnswer passes the agent's error answer resp through fromGuest: one it changes
// is replaced by the node's. The agent's body is read (at most 64 KiB, as the agent's client
// reads one) and given back to be passed on otherwise.
func guestRefusalAnswer(resp *http.Response) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	e, changed := fromGuest(nodeapi.ParseError(resp.StatusCode, b))
	if changed {
		replaceAnswer(resp, e)
		return
	}
	setAnswerBody(resp, b)
}

// replaceAnswer makes resp, the agent's answer, the node's error e instead: none of the
// agent's headers or body is passed on. The agent's body is closed unread.
func replaceAnswer(resp *http.Response, e *nodeapi.Error) {
	_ = resp.Body.Close()
	b, _ := json.Marshal(nodeapi.ErrorBody{Error: e})
	b = append(b, '\n')
	resp.StatusCode, resp.Status = e.Status, fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
	resp.Header = http.Header{"Content-Type": {"application/json"}}
	setAnswerBody(resp, b)
}

// refuseAnswer makes resp, the agent's answer, the node's 502 guest_error saying msg.
func refuseAnswer(resp *http.Response, msg string) {
	replaceAnswer(resp, &nodeapi.Error{Status: http.StatusBadGateway, Code: nodeapi.CodeGuestError, Message: msg})
}

// setAnswerBody makes b resp's whole body.
func setAnswerBody(resp *http.Response, b []byte) {
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	resp.Header.Del("Transfer-Encoding")
	resp.TransferEncoding = nil
}

// clip is s cut to at most n bytes, marked so.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// explainedExec is an exec's answer from the agent, passed through line by line; when it
// breaks off and whyBroke names a refusal of the guest's state (its guest died under it:
// Node.whyExecBroke), or the node's backstop ended it (execBackstop), it ends with that as an
// agent.BrokenLine, so that the caller learns the reason at once, as Node.Exec's caller in
// process does, and need not wait for Redis to record it. Such a line is the node's alone:
// the agent is the guest's, and a line of its answer that reads as one (agent.ProxyLine) ends
// the answer with the node's own, a 502 guest_error, instead of passing for the node's
// refusal (a policy kill, a state). Before it passes on the line its caller reads as the
// result (agent.ResultLine), it runs the exec's resultCheck, if any.
type explainedExec struct {
	body  io.ReadCloser
	lines *bufio.Reader // body's
	ctx   context.Context
	// whyBroke explains a read of the answer that failed (Node.whyExecBroke).
	whyBroke func(context.Context, error) error
	line     []byte        // what is left to pass on of the agent's line read last
	long     []byte        // a line longer than lines' buffer, gathered
	tail     *bytes.Reader // the node's last line, once the answer broke
	// clock is the exec's backstop (execBackstop): the exec waits on its agent in a read,
	// and on its caller, who takes what was read, between reads.
	clock *execClock
	// check runs before the result line is passed on (nil: none).
	check *resultCheck
	// ended keeps the status of the node's line, if any (nil: not kept).
	ended *execEnd
}

func newExplainedExec(ctx context.Context, body io.ReadCloser, whyBroke func(context.Context, error) error, clock *execClock, check *resultCheck) *explainedExec {
	ended, _ := ctx.Value(execEndKey{}).(*execEnd)
	return &explainedExec{body: body, lines: bufio.NewReaderSize(body, 64<<10), ctx: ctx, whyBroke: whyBroke, clock: clock, check: check, ended: ended}
}

func (e *explainedExec) Read(p []byte) (int, error) {
	if len(e.line) > 0 {
		n := copy(p, e.line)
		e.line = e.line[n:]
		return n, nil
	}
	if e.tail != nil {
		return e.tail.Read(p)
	}
	e.clock.toAgent()
	line, err := e.readLine()
	e.clock.toCaller()
	switch {
	case err == nil && agent.ProxyLine(line):
		e.end(&nodeapi.Error{Status: 502, Code: nodeapi.CodeGuestError,
			Message: "node: the guest's agent sent a line shaped as the node's own error record; the exec was ended, which kills its processes as its timeout does"})
	case err == nil:
		if e.check != nil && agent.ResultLine(line) {
			// Read as the caller reads it, not by its bytes: the agent is the guest's, and
			// may spell the result's key any way a JSON decoder takes.
			e.check.run()
		}
		e.line = line
	case errors.Is(err, io.EOF):
		return 0, io.EOF
	case errors.Is(err, errLineTooLong):
		e.end(&nodeapi.Error{Status: 502, Code: nodeapi.CodeGuestError,
			Message: fmt.Sprintf("node: the guest's agent sent a line of its exec's answer longer than %d bytes; the exec was ended", agent.MaxExecLine)})
	default:
		if cause := context.Cause(e.ctx); errors.Is(cause, errExecUnanswered) {
			e.end(&nodeapi.Error{Status: 502, Code: nodeapi.CodeAgentUnreachable, Message: cause.Error()})
			break
		}
		var se *StateError
		if !errors.As(e.whyBroke(e.ctx, err), &se) {
			return 0, err
		}
		e.end(apiError(se))
	}
	return e.Read(p)
}

// end ends the answer with ae, the node's line, and closes the agent's answer: the agent then
// kills the exec's processes, as its timeout does. The exec is counted by ae's status.
func (e *explainedExec) end(ae *nodeapi.Error) {
	if e.ended != nil {
		e.ended.status.Store(int32(ae.Status))
	}
	line, _ := json.Marshal(map[string]agent.BrokenLine{"error": {Status: ae.Status, Code: ae.Code, Message: ae.Message}})
	e.tail = bytes.NewReader(append(line, '\n'))
	_ = e.body.Close()
}

// errLineTooLong is a line of the agent's answer longer than agent.MaxExecLine.
var errLineTooLong = errors.New("a line of the agent's answer is too long")

// readLine reads the agent's next line, its newline included (the last may lack one): a
// line that fits the reader's buffer is the buffer's, until the next read. A read that
// fails mid-line drops the line's start, so that the node's line, if any, starts a line.
func (e *explainedExec) readLine() ([]byte, error) {
	e.long = e.long[:0]
	for {
		part, err := e.lines.ReadSlice('\n')
		if len(e.long)+len(part) > agent.MaxExecLine {
			e.long = nil
			return nil, errLineTooLong
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			e.long = append(e.long, part...)
			continue
		}
		if len(e.long) > 0 {
			part = append(e.long, part...)
			e.long = part
		}
		switch {
		case err == nil:
			return part, nil
		case errors.Is(err, io.EOF) && len(part) > 0:
			return part, nil
		default:
			return nil, err
		}
	}
}

func (e *explainedExec) Close() error { return e.body.Close() }

func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
