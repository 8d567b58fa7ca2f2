package node_test

import (
	"testing"
	"time"

	"wb/session"
	"wb/store"
)

// TestSessionEndedElsewhere: the placer declares a host failure for a node that still lives
// (its heartbeat lapsed on a loaded machine), or deletes it: the node destroys the
// guest within a few heartbeats rather than run and meter it until its own timers fire.
func TestSessionEndedElsewhere(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	const project = "proj_elsewhere"
	d := newDriver(t, "runc", tempDir(t))
	n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_elsewhere"))
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 600, lifeS: 3600, res: small()})
	if _, err := st.Transition(ctxT(t, 10*time.Second), store.Change{Project: project, ID: s.ID,
		From: session.Running, To: session.Failed, Driver: session.Placer, Reason: session.HostFailure}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := waitGuestGone(t, d, s.ID, 30*time.Second); err != nil {
		t.Fatalf("the session failed elsewhere but its guest runs on: %v", err)
	}
	t.Logf("guest destroyed %s after the session failed elsewhere", time.Since(start).Round(time.Millisecond))
	if got := get(t, st, project, s.ID); got.State != session.Failed || reasonOf(got) != "(host_failure)" {
		t.Errorf("the session is %s %s, want failed (host_failure) as the placer left it", got.State, reasonOf(got))
	}
	if _, err := execIn(ctxT(t, 10*time.Second), n.Node, s, "true"); err == nil {
		t.Error("the node still runs commands in the destroyed guest")
	}
}

// TestStopThatNeverCame: a session the control plane moved to stopping without the node
// hearing of it (its gateway died between the transition and the node's stop) is stopped by
// the node once it has been stopping for a while, for the reason Redis gives; not at once,
// since a stop on its way (a desktop's sleep saving the guest as it stops) must find the
// guest running. Before, the guest ran and the session stayed stopping for ever.
func TestStopThatNeverCame(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	const project = "proj_stopmissed"
	d := newDriver(t, "runc", tempDir(t))
	n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_stopmissed"))
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 600, lifeS: 3600, res: small()})
	if _, err := st.Transition(ctxT(t, 10*time.Second), store.Change{Project: project, ID: s.ID,
		From: session.Running, To: session.Stopping, Driver: session.Caller, Reason: session.Deleted}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	time.Sleep(5 * time.Second)
	if res, err := execIn(ctxT(t, 30*time.Second), n.Node, s, "true"); err != nil || res.ExitCode != 0 {
		t.Fatalf("5 s into a stop on its way the guest no longer runs: %+v, %v", res, err)
	}
	got, _ := waitState(t, st, project, s.ID, 2*time.Minute, session.Stopped)
	if reasonOf(got) != "(deleted)" {
		t.Errorf("the session ended %s, want deleted as Redis had it", reasonOf(got))
	}
	if err := waitGuestGone(t, d, s.ID, 30*time.Second); err != nil {
		t.Errorf("the guest of the session stopped runs on: %v", err)
	}
	t.Logf("stopped %s after the transition", time.Since(start).Round(time.Millisecond))
}
