package node_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/agent"
	"wb/node"
	"wb/session"
)

// fakeChecker answers runtime events the way the test sets: a kill for a listed program,
// a deny, an error (a failing or unreachable decision point), an answer after a stall, or
// none at all (until release is closed, whatever its context). It records what it saw.
type fakeChecker struct {
	mu      sync.Mutex
	kill    string // argv word that gets the session killed
	deny    string // argv word answered with Deny
	broken  string // argv word answered with an error
	slow    string // argv word allowed after stall
	stall   time.Duration
	hung    string // argv word never answered, its context ignored (until release is closed)
	release chan struct{}
	seen    []session.GuestEvent
}

func (c *fakeChecker) Check(ctx context.Context, _ node.RuntimeSession, event session.GuestEvent) (node.Verdict, error) {
	has := func(word string) bool {
		return word != "" && slices.ContainsFunc(event.Argv, func(a string) bool { return strings.Contains(a, word) })
	}
	// A loaded host's stall, or a decision point that hangs: outside the lock, as other
	// events' decisions go on meanwhile.
	switch {
	case has(c.slow):
		select {
		case <-time.After(c.stall):
		case <-ctx.Done():
			return node.Verdict{}, ctx.Err()
		}
	case has(c.hung):
		// As a decision stuck on a lock does (a plugin's load behind another caller's, a
		// policy's compile): deaf to its context.
		<-c.release
		return node.Verdict{}, errors.New("let go at the test's end")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = append(c.seen, event)
	switch {
	case has(c.kill):
		return node.Verdict{Kill: true, Rule: "no_" + c.kill}, nil
	case has(c.deny):
		return node.Verdict{Deny: true, Reason: "policy pol_x@1: evaluation failed: timed out"}, nil
	case has(c.broken):
		return node.Verdict{}, errors.New("policies: platform runtime: boom")
	}
	return node.Verdict{}, nil
}

func (c *fakeChecker) events() []session.GuestEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.seen)
}

// TestRuntimeChecks: every exec and every PTY command goes to the runtime decision point.
// A policy that cannot decide (Deny, or an error) refuses the command and the session goes
// on; a kill refuses it and ends the session (failed, policy_violation).
func TestRuntimeChecks(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{"runsc", "cloudhv"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			testRuntimeChecks(t, rt)
		})
	}
}

func testRuntimeChecks(t *testing.T, rt string) {
	const project = "proj_rtchk"
	st, _ := newStore(t)
	d := newDriver(t, rt, tempDir(t))
	checker := &fakeChecker{kill: "xmrig", deny: "denied-cmd", broken: "broken-cmd", slow: "slow-cmd", stall: 3 * time.Second,
		hung: "hung-cmd", release: make(chan struct{})}
	var letGo sync.Once
	release := func() { letGo.Do(func() { close(checker.release) }) }
	t.Cleanup(release)
	cfg := nodeConfig(t, st, d, tempDir(t), "node_rtchk")
	cfg.Runtime = checker
	n := startNode(t, cfg)
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	srv := httptest.NewServer(n.Handler("tok"))
	t.Cleanup(srv.Close)
	ac := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+s.ID+"/agent", "tok")

	// Refused without a kill: exec through the node's Go API and through its HTTP proxy,
	// and a PTY.
	for _, cmd := range []string{"echo denied-cmd", "echo broken-cmd"} {
		_, err := execIn(ctxT(t, 30*time.Second), n.Node, s, cmd)
		var re *node.RefusedError
		if !errors.As(err, &re) {
			t.Errorf("exec %q: %v, want a *node.RefusedError", cmd, err)
		}
		_, err = ac.Exec(ctxT(t, 30*time.Second), agent.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}}, nil)
		var ae *agent.Error
		if !errors.As(err, &ae) || ae.Status != 403 || !strings.Contains(ae.Message, "could not decide") {
			t.Errorf("exec %q over HTTP: %v, want 403 naming the refusal", cmd, err)
		}
		conn, resp, err := ac.PTY(ctxT(t, 30*time.Second), 80, 24, cmd)
		if err == nil {
			conn.CloseNow()
			t.Errorf("PTY %q was opened, want it refused", cmd)
		} else if resp == nil || resp.StatusCode != 403 {
			t.Errorf("PTY %q: %v (%v), want 403", cmd, err, resp)
		}
	}
	// A decision that answers after a loaded host's stall (longer than the old 2 s bound) is
	// waited for; one that never answers is refused, within the node's bound.
	if res, err := execIn(ctxT(t, 30*time.Second), n.Node, s, "echo slow-cmd"); err != nil || res.ExitCode != 0 {
		t.Errorf("exec after a 3 s decision: %+v, %v; want it run", res, err)
	}
	start := time.Now()
	hung := make(chan error, 1)
	go func() {
		_, err := execIn(ctxT(t, 60*time.Second), n.Node, s, "echo hung-cmd")
		hung <- err
	}()
	select {
	case err := <-hung:
		var re *node.RefusedError
		if !errors.As(err, &re) {
			t.Errorf("exec with a decision that never answers: %v, want a *node.RefusedError", err)
		}
		if took := time.Since(start); took > 30*time.Second {
			t.Errorf("a decision that never answers was refused after %s, want the node's bound (10 s)", took.Round(100*time.Millisecond))
		}
	case <-time.After(60 * time.Second):
		t.Error("an exec whose decision never answers (deaf to its context) still waits after 60 s, want it refused at the node's bound (10 s)")
		release()
		<-hung
	}
	if got := get(t, st, project, s.ID); got.State != session.Running {
		t.Fatalf("after refused commands the session is %s %s, want running", got.State, reasonOf(got))
	}
	// An allowed PTY opens, and the decision point saw its command as an exec.
	conn, _, err := ac.PTY(ctxT(t, 30*time.Second), 80, 24, "echo fine")
	if err != nil {
		t.Fatalf("allowed PTY: %v", err)
	}
	conn.CloseNow()
	if !slices.ContainsFunc(checker.events(), func(ev session.GuestEvent) bool {
		return ev.Type == session.GuestExec && ev.PTY && slices.Equal(ev.Argv, []string{"/bin/sh", "-c", "echo fine"})
	}) {
		t.Errorf("the PTY's command was not put to the decision point: %v", checker.events())
	}

	// A PTY whose command the policy kills is refused, and the session is stopped.
	conn, resp, err := ac.PTY(ctxT(t, 30*time.Second), 80, 24, "xmrig --donate-level 0")
	if err == nil {
		conn.CloseNow()
		t.Fatal("a PTY running a killed command was opened")
	}
	if resp == nil || resp.StatusCode != 403 {
		t.Errorf("killed PTY: %v (%v), want 403", err, resp)
	}
	end, _ := waitState(t, st, project, s.ID, 30*time.Second, session.Stopped, session.Failed, session.Expired)
	if end.State != session.Failed || end.StateReason == nil || *end.StateReason != session.PolicyViolation {
		t.Errorf("after the killed PTY the session is %s %s, want failed (policy_violation)", end.State, reasonOf(end))
	}
}
