package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"wb/agent"
	"wb/internal/stallwrite"
	"wb/node/nodeapi"
	"wb/session"
	"wb/store"
)

// DefaultWriteStall is Config.WriteStall's default: a caller that takes nothing for a
// minute has stopped reading.
const DefaultWriteStall = time.Minute

// runExec checks that sess can run a command and runs it, recording activity. With a nil out
// the output is collected, at most MaxOutputBytes per stream (the rest counted and dropped).
func (s *Server) runExec(ctx context.Context, sess *session.Session, req session.ExecRequest, out func(session.ExecChunk) error) (session.ExecResult, error) {
	argv, err := req.Argv()
	if err != nil {
		return session.ExecResult{}, err
	}
	if sess.State != session.Running {
		return session.ExecResult{}, errNeedsRunning(opExec, sess.State)
	}
	g, err := s.guests()
	if err != nil {
		return session.ExecResult{}, err
	}
	// The activity is recorded while the command runs, not before: one Redis round trip less
	// on every exec's way. The answer waits for it, so that activity is never recorded after it.
	touched := make(chan error, 1)
	go func() { touched <- s.Store.Touch(context.WithoutCancel(ctx), sess.ProjectID, sess.ID) }()
	var buffered *session.OutputBuffer
	if out == nil {
		buffered = session.NewOutputBuffer(s.MaxOutputBytes)
		out = buffered.Add
	}
	res, err := g.Exec(ctx, sess, req, argv, out)
	if terr := <-touched; terr != nil {
		// The command ran: its answer stands. The node records the activity too (its idle timer).
		s.log.WarnContext(ctx, "exec: the session's activity was not recorded", "session", sess.ID, "err", terr)
	}
	if buffered != nil && err == nil {
		buffered.Fill(&res)
	}
	if ae := nodePolicyRefusal(err); ae != nil {
		// The runtime decision point killed the session for this command, or could not decide.
		return res, policyAnswer(ae)
	}
	if err != nil {
		// The node names the guest's end when it knows it (Node.whyExecBroke): a refusal
		// needs no wait for Redis, which a loaded host updates seconds later.
		if status, _ := nodeRefusal(err); status == 0 {
			if ended := s.endedDuring(ctx, sess); ended != nil {
				return res, ended
			}
		}
		return res, s.errNode(ctx, "exec_failed", "the node could not run the command", err)
	}
	return res, nil
}

// nodePolicyRefusal answers the node's runtime policy refusal in err, the 403 its proxy
// answers (or Local, in process) with the node's code; nil for any other. A 403 of another
// code is the guest's agent's (an older node passes its answers on as they came): a hostile
// guest must not make its sessions look policy-killed.
func nodePolicyRefusal(err error) *agent.Error {
	var ae *agent.Error
	if errors.As(err, &ae) && ae.Status == http.StatusForbidden && (ae.Code == nodeapi.CodePolicyViolation || ae.Code == nodeapi.CodePolicyError) {
		return ae
	}
	return nil
}

// policyAnswer is the API's answer to the node's runtime policy refusal ae: 403
// policy_violation when the policy killed the session for the command, 403 policy_error when
// it could not decide (the command was refused, the session goes on). A caller must tell
// the two apart: the one is its command's doing, the other the policy's fault.
func policyAnswer(ae *agent.Error) *apiError {
	if ae.Code == nodeapi.CodePolicyError {
		return &apiError{Status: 403, Type: "denied", Code: "policy_error", Message: fmt.Sprintf(
			"the command was refused: the session's runtime policy could not decide on it (%s); check that policy, and see the decision log for its error. The session goes on",
			ae.Message)}
	}
	return &apiError{Status: 403, Type: "denied", Code: "policy_violation", Message: ae.Message}
}

// endedDuring explains an exec whose answer broke off because its guest died under it (a
// memory hog the OOM killer took, a guest that crashed): the node records the end within a
// poll or two, so it waits up to three seconds for the session to turn terminal and answers
// 409 naming the state and reason; nil when it did not end.
func (s *Server) endedDuring(ctx context.Context, sess *session.Session) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		cur, err := s.Store.Get(ctx, sess.ProjectID, sess.ID)
		if err == nil && cur.State.Terminal() {
			reason := "no reason recorded"
			if cur.StateReason != nil {
				reason = string(*cur.StateReason)
			}
			return errState("the session's guest ended during the exec: the session is %s (%s)", cur.State, reason)
		}
		if err != nil || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req session.ExecRequest
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	// An invalid request is its 400 however busy the project is: before the cap's 429.
	if _, err := req.Argv(); err != nil {
		return err
	}
	sess, err := s.loadSession(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.execs.acquire(p.ID, s.MaxConcurrentExecs); err != nil {
		return err
	}
	defer s.execs.release(p.ID)
	// A caller that stays connected but takes none of the answer for WriteStall ends the
	// exec: the output's write fails, which ends the node's exec and kills its processes.
	sw := stallwrite.New(w, s.WriteStall)
	under := w
	defer func() {
		sw.Close()
		if sw.Stalled() {
			markCutOff(under) // a replay of the bytes taken would look like a whole answer
			s.log.WarnContext(r.Context(), "exec: its caller took none of the answer within the stall; the exec is ended",
				"session", sess.ID, "stall", s.WriteStall)
		}
	}()
	w = sw
	if !strings.Contains(r.Header.Get("Accept"), "application/x-ndjson") {
		res, err := s.runExec(r.Context(), sess, req, nil)
		if err != nil {
			return err
		}
		writeJSON(w, 200, res)
		return nil
	}
	if sess.State != session.Running {
		return errNeedsRunning(opExec, sess.State)
	}
	// Streamed: one JSON line per chunk, then {"exit_code": N, ...}.
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	started := false
	start := func() {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(200)
			started = true
		}
	}
	res, err := s.runExec(r.Context(), sess, req, func(c session.ExecChunk) error {
		mu.Lock()
		defer mu.Unlock()
		start()
		if err := enc.Encode(c.Wire()); err != nil {
			return fmt.Errorf("client went away: %w", err)
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil && !started {
		return err
	}
	start()
	if err != nil {
		_ = enc.Encode(errorBody{Error: *toAPIError(err)})
		return nil
	}
	res.Stdout, res.Stderr = "", "" // already streamed
	_ = enc.Encode(session.ExecEnd{ExitCode: res.ExitCode, DurationMs: res.DurationMs, TimedOut: res.TimedOut})
	return nil
}
