package node

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/node/nodeapi"
	"wb/session"
)

// Local is the node's guests as the gateway's exec, PTY and files handlers use them in
// process, on the edge's data path that the node serves itself. It has the method set of
// gateway.Guests (package node does not import gateway), and answers as node/client does
// over the node's API, so that the handlers answer the same statuses either way: a session
// the node holds no guest for is a *nodeapi.Error 404, a guest whose state does not allow the
// call a 409, and a command the runtime decision point refused an *agent.Error 403 (the
// node's proxy answers that, and the agent's client reads it so). Safe for concurrent use.
type Local struct {
	n *Node

	mu      sync.Mutex
	touched map[string]time.Time // session → last touch, so that PTY frames touch once a second
}

// Local answers the node's guests for in-process callers.
func (n *Node) Local() *Local { return &Local{n: n, touched: map[string]time.Time{}} }

// Exec runs a command in the session's guest, after the runtime decision point. It is
// counted in the node's metrics as one through its API is, by the status its error answers.
func (c *Local) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, argv []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	res, err := c.n.Exec(ctx, s, req, argv, out)
	var (
		ke *KilledError
		re *RefusedError
	)
	if errors.As(err, &ke) || errors.As(err, &re) {
		err = refusalAsAgentError(err)
	} else {
		err = asAPIError(err)
	}
	c.n.Metrics.agentRequest("exec", localExecStatus(ctx, err))
	return res, err
}

// localExecStatus is the status the node's API would have answered an exec that ended in
// err (as Local.Exec returns it), for its metrics.
func localExecStatus(ctx context.Context, err error) int {
	var ae *agent.Error
	switch {
	case err == nil:
		return http.StatusOK
	case errors.As(err, &ae):
		return ae.Status // a refusal, or the guest's error
	case ctx.Err() != nil:
		// Its caller went: through the API, the exec's answer was under way until then.
		return http.StatusOK
	}
	return apiError(err).Status
}

// Agent answers a client of the running guest's agent whose PTYs pass the runtime decision
// point first, as they do through the node's proxy. A refusal here (no guest, a guest not
// running) is counted in the node's metrics as the node's API counts the call it refuses,
// under the kind ctx carries (nodeapi.WithAgentKind).
func (c *Local) Agent(ctx context.Context, s *session.Session) (*agent.Client, error) {
	l, ag, err := c.n.running(s)
	if err != nil {
		c.n.Metrics.agentRequest(nodeapi.AgentKindOf(ctx), apiError(err).Status)
		return nil, asAPIError(err)
	}
	a := *ag
	// The agent's refusals are the guest's, never passing for the node's (as its proxy does).
	a.Refusal = fromGuestAgent
	// The file calls and PTYs are counted as the node's API counts those through it.
	a.Answered = func(method, path string, status int) {
		c.n.Metrics.agentRequest(agentKind(method, path), status)
	}
	a.CheckPTY = func(ctx context.Context, command string) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.g.State != session.Running {
			e := apiError(&StateError{SessionID: s.ID, State: l.g.State})
			return &agent.Error{Status: e.Status, Code: e.Code, Message: e.Message}
		}
		if err := c.n.checkPTY(ctx, l, command); err != nil {
			return refusalAsAgentError(err)
		}
		return nil
	}
	return &a, nil
}

// Touch records activity, at most once a second per session: every PTY frame calls it, and
// each touch writes the guest's journal.
func (c *Local) Touch(s *session.Session) {
	now := time.Now()
	c.mu.Lock()
	if now.Sub(c.touched[s.ID]) < time.Second {
		c.mu.Unlock()
		return
	}
	if len(c.touched) > 100000 {
		clear(c.touched)
	}
	c.touched[s.ID] = now
	c.mu.Unlock()
	c.n.Touch(s)
}

// Retime applies a session's new timers.
func (c *Local) Retime(ctx context.Context, s *session.Session) error {
	return asAPIError(c.n.Retime(ctx, s))
}

// Pause freezes the guest.
func (c *Local) Pause(ctx context.Context, s *session.Session) error {
	return asAPIError(c.n.Pause(ctx, s))
}

// Resume thaws it.
func (c *Local) Resume(ctx context.Context, s *session.Session) error {
	return asAPIError(c.n.Resume(ctx, s))
}

// Snapshot saves it.
func (c *Local) Snapshot(ctx context.Context, s *session.Session, snapshotID string, memory bool) (hypervisor.SnapshotInfo, error) {
	info, err := c.n.Snapshot(ctx, s, snapshotID, memory)
	return info, asAPIError(err)
}

// Stop tears the guest down; the node ends the session.
func (c *Local) Stop(ctx context.Context, s *session.Session) error {
	return asAPIError(c.n.Stop(ctx, s))
}

// StopSaving is Stop after saving the guest as snapshot snapshotID (Node.StopSaving).
func (c *Local) StopSaving(ctx context.Context, s *session.Session, snapshotID string) (hypervisor.SnapshotInfo, error) {
	info, err := c.n.StopSaving(ctx, s, snapshotID)
	return info, asAPIError(err)
}

// asAPIError answers a refusal of the node (no guest, a state that does not allow the call)
// as the *nodeapi.Error its API would send, and any other error as it is: a field error
// stays the caller's 400, a failure stays the node's.
func asAPIError(err error) error {
	var (
		ng *NoGuestError
		se *StateError
	)
	if errors.As(err, &ng) || errors.As(err, &se) {
		return apiError(err)
	}
	return err
}

// refusalAsAgentError is a runtime refusal as the agent's client reads it from the node's
// proxy.
func refusalAsAgentError(err error) error {
	e := runtimeRefusal(err)
	return &agent.Error{Status: e.Status, Code: e.Code, Message: e.Message, Param: e.Param}
}
