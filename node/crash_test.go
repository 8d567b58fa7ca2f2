package node_test

import (
	"strings"
	"testing"
	"time"

	"wb/node"
	"wb/session"
	"wb/store"
)

// deleteSession does what DELETE does: running → stopping (caller, deleted), then the node
// tears the guest down and the session stops.
func deleteSession(t *testing.T, st *store.Store, n *node.Node, project, id string) {
	t.Helper()
	s, err := st.Transition(ctxT(t, 10*time.Second), store.Change{Project: project, ID: id, From: session.Running,
		To: session.Stopping, Driver: session.Caller, Reason: session.Deleted})
	if err != nil {
		t.Fatalf("delete %s: %v", id, err)
	}
	if err := n.Stop(ctxT(t, time.Minute), s); err != nil {
		t.Fatalf("delete %s: node stop: %v", id, err)
	}
	end, _ := waitState(t, st, project, id, time.Minute, session.Stopped, session.Failed, session.Expired)
	checkEnded(t, end, session.Stopped, session.Deleted)
}

// TestGuestCrash: a guest that kills its own init (the agent) dies by its own doing while its
// host works: the session fails with guest_crash, never host_failure, under runsc and runc
// and in a cloudhv VM.
func TestGuestCrash(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	for _, rt := range []string{"runsc", "runc", "cloudhv"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			project := "proj_crash_" + rt
			d := newDriver(t, rt, tempDir(t))
			n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_crash_"+rt))
			s := provision(t, st, n.Node, project, sessionOpts{idleS: 300, lifeS: 600})
			// SIGTERM is the one signal PID 1 (the agent) takes from inside: it ends it.
			res, err := execIn(ctxT(t, 30*time.Second), n.Node, s, "kill -TERM 1; sleep 10")
			t.Logf("exec: exit %d, err %v", res.ExitCode, err)
			if err != nil && !strings.Contains(err.Error(), "reason guest_crash") {
				t.Errorf("the exec whose guest crashed under it: %v; want the error to name guest_crash", err)
			}
			end, _ := waitState(t, st, project, s.ID, 30*time.Second, session.Failed, session.Stopped, session.Expired)
			checkEnded(t, end, session.Failed, session.GuestCrash)
			checkSlots(t, st, project)
			if err := waitGuestGone(t, d, s.ID, 30*time.Second); err != nil {
				t.Errorf("the session failed with guest_crash but its guest was not torn down: %v", err)
			}
		})
	}
}
