package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"wb/agent"
	"wb/session"
)

// RuntimeSession is what the runtime decision point knows of a session.
type RuntimeSession struct {
	ID        string `json:"id"`
	Project   string `json:"project_id"`
	PolicyID  string `json:"policy_id,omitempty"`
	EndUserID string `json:"end_user_id,omitempty"`
	Tier      int    `json:"tier"`
}

// Verdict is the runtime decision point's answer about one guest event.
type Verdict struct {
	Kill        bool   // stop the session: policy_violation, with Rule
	Rule        string //
	AllowEgress bool   // for an egress event: the connection may go out
	// Deny refuses the event without stopping the session: the project's policy could not
	// answer (it failed or ran out of time), so the event fails closed. Reason says why.
	Deny   bool
	Reason string
}

// RuntimeChecker is the runtime decision point (the session's pinned Rego policy and the
// project's plugins).
type RuntimeChecker interface {
	Check(ctx context.Context, s RuntimeSession, event session.GuestEvent) (Verdict, error)
}

// KilledError is an event that a policy answered with a kill.
type KilledError struct{ Rule string }

func (e *KilledError) Error() string {
	return fmt.Sprintf("forbidden by policy rule %s; the session is stopped (policy_violation)", e.Rule)
}

// RefusedError is an event refused because the runtime decision point could not allow it
// (the project's policy failed or ran out of time, or the decision point was unreachable):
// the event fails closed, the session goes on.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string {
	return "refused: the session's runtime policy could not decide (" + e.Reason + "); fix or re-pin the policy, or retry"
}

// checkExec asks the runtime decision point about an exec; a kill ends the session with
// policy_violation and the rule (*KilledError); a policy that cannot decide refuses the exec
// (*RefusedError). The caller holds l.mu.
func (n *Node) checkExec(ctx context.Context, l *live, argv []string) error {
	return n.checkCommand(ctx, l, argv, false)
}

// checkPTY asks the runtime decision point about the command of a PTY, as an exec event
// with "pty": true and the argv the agent will run: /bin/sh -c command, or an interactive
// /bin/sh. The caller holds l.mu.
func (n *Node) checkPTY(ctx context.Context, l *live, command string) error {
	argv := []string{"/bin/sh"}
	if command != "" {
		argv = append(argv, "-c", command)
	}
	return n.checkCommand(ctx, l, argv, true)
}

func (n *Node) checkCommand(ctx context.Context, l *live, argv []string, pty bool) error {
	if n.Runtime == nil || len(argv) == 0 {
		return nil
	}
	_, err := n.check(ctx, l, session.GuestEvent{Type: session.GuestExec, Argv: argv, PTY: pty}, runtimeCheckTimeout)
	return err
}

// checkEvent asks the runtime decision point about a guest event seen outside a request
// (a resource sample); a kill ends the session. The caller does not hold l.mu.
func (n *Node) checkEvent(ctx context.Context, l *live, event session.GuestEvent) {
	if n.Runtime == nil {
		return
	}
	op := lockFor(l, "runtime policy check")
	defer op.unlock()
	if l.g.State == session.Running {
		_, _ = n.check(ctx, l, event, backgroundCheckTimeout)
	}
}

// runtimeCheckTimeout gives up on a runtime decision that a request waits for (an exec, a
// PTY, an egress connection), which then refuses its event. It is a backstop for a decision
// point that hangs, not a budget: each of a project's policies and plugins has its own
// (policies.Options.EvalTimeout, the plugin host's call deadline), and the platform's policy
// answers in microseconds. A loaded host stalls a whole process for seconds (a cold run here:
// 2.3 s journal writes, the placer woken 2.8 s late), and with a 2 s bound such a stall
// refused an exec the platform's policy allowed.
const runtimeCheckTimeout = 10 * time.Second

// backgroundCheckTimeout bounds a decision no one waits for (a resource sample, a process
// start): the usage loop asks them guest after guest, so one that hangs delays every other
// guest's, and the next round asks again.
const backgroundCheckTimeout = 2 * time.Second

// check runs the runtime decision point on one event; a kill ends the session
// (*KilledError). An event the decision point cannot allow fails closed: a failed decision
// or a Deny answers *RefusedError, with AllowEgress false. The caller holds l.mu.
func (n *Node) check(ctx context.Context, l *live, event session.GuestEvent, timeout time.Duration) (Verdict, error) {
	g := l.g
	v, err := n.decide(ctx, RuntimeSession{ID: g.SessionID, Project: g.Project, PolicyID: g.PolicyID,
		EndUserID: g.EndUserID, Tier: g.Tier}, event, timeout)
	if err != nil {
		// The detail stays in the log: it may name internal addresses.
		n.Logger.Warn("node: runtime decision failed; the event is refused", "session", g.SessionID, "event", event.Type, "err", err)
		const reason = "the runtime decision point did not answer"
		return Verdict{Deny: true, Reason: reason}, &RefusedError{Reason: reason}
	}
	if !v.Kill {
		if v.Deny {
			n.Logger.Warn("node: runtime policy refused the event", "session", g.SessionID, "event", event.Type, "reason", v.Reason)
			return Verdict{Deny: true, Reason: v.Reason}, &RefusedError{Reason: v.Reason}
		}
		return v, nil
	}
	rule := v.Rule
	n.Logger.Warn("policy kill", "session", g.SessionID, "rule", rule, "event", event.Type)
	n.end(ctx, l, session.Policy, session.PolicyViolation, rule)
	return v, &KilledError{Rule: rule}
}

// decide asks the runtime decision point, and stops waiting after timeout even when the
// decision does not (one deaf to its context: a plugin's load behind another caller's, a
// policy's compile): the caller holds the guest's lock, which every other call on the guest
// waits for. The decision then ends on its own, unwaited for; while maxDecisions are under
// way (a decision point that hangs leaves one per event), the next is refused at once.
func (n *Node) decide(ctx context.Context, s RuntimeSession, event session.GuestEvent, timeout time.Duration) (Verdict, error) {
	if n.decisions.Add(1) > maxDecisions {
		n.decisions.Add(-1)
		return Verdict{}, fmt.Errorf("%d runtime decisions are under way already (some hang)", maxDecisions)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type answer struct {
		v   Verdict
		err error
	}
	done := make(chan answer, 1)
	go func() {
		defer n.decisions.Add(-1)
		v, err := n.Runtime.Check(ctx, s, event)
		done <- answer{v, err}
	}()
	select {
	case a := <-done:
		return a.v, a.err
	case <-ctx.Done():
		select {
		case a := <-done: // it answered as the time ran out
			return a.v, a.err
		default:
		}
		return Verdict{}, fmt.Errorf("no decision (bound %s): %w", timeout, ctx.Err())
	}
}

// maxDecisions bounds the runtime decisions under way on a node: far above those its guests
// make at once (each under its guest's lock), and a bound on what hung ones hold.
const maxDecisions = 1024

// checkProcesses puts every process that appeared in the guest since the last look to the
// runtime decision point as a process_start event. It looks every flush period, so a process
// that lives shorter may go unseen (its exec was checked all the same).
func (n *Node) checkProcesses(ctx context.Context, l *live) {
	if n.Runtime == nil {
		return
	}
	l.mu.Lock()
	c, direct, guest := l.agent, l.direct != nil, l.g.GuestID
	l.mu.Unlock()
	var procs []agent.Proc
	var err error
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	switch {
	case c != nil:
		procs, err = c.Procs(pctx)
	case direct:
		procs, err = n.directProcs(pctx, guest)
	default:
		err = errors.New("no agent")
	}
	cancel()
	if err != nil {
		return
	}
	l.mu.Lock()
	if l.seen == nil {
		l.seen = map[int]bool{1: true} // the agent
	}
	var fresh []session.GuestEvent
	now := map[int]bool{}
	for _, p := range procs {
		now[p.PID] = true
		if !l.seen[p.PID] {
			fresh = append(fresh, session.GuestEvent{Type: session.GuestProcessStart, PID: p.PID, Argv: p.Argv})
		}
	}
	now[1] = true
	l.seen = now
	l.mu.Unlock()
	for _, ev := range fresh {
		n.checkEvent(ctx, l, ev)
	}
}
