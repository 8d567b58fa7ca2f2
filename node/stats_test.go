package node_test

import (
	"context"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/session"
	"wb/store"
)

// hungStats is a driver whose counters never answer: a VMM's API that hangs. Each read
// is announced on reads, when there is room.
type hungStats struct {
	testDriver
	reads chan struct{}
}

func (h hungStats) Stats(ctx context.Context, _ string) (hypervisor.Stats, error) {
	select {
	case h.reads <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return hypervisor.Stats{}, ctx.Err()
}

// TestHungStatsHoldNoSession: a guest's counters that never answer delay neither a stop nor
// the teardown after it. The node reads them under the guest's lock (each sample, at every
// state change and usage flush), so an unbounded read held the timers and the teardown
// behind it: a cold make test's idle timer fired 7 s late.
func TestHungStatsHoldNoSession(t *testing.T) {
	t.Parallel()
	const project = "proj_hung_stats"
	st, _ := newStore(t)
	d := newDriver(t, "runc", tempDir(t))
	reads := make(chan struct{}, 1)
	n := startNode(t, nodeConfig(t, st, hungStats{d, reads}, tempDir(t), "node_hung_stats"))
	t0 := time.Now()
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	// Provision reads the counters once the session runs (its CPU baseline): bounded, it
	// answers in seconds, not at the end of its three minutes.
	if took := time.Since(t0); took > time.Minute {
		t.Fatalf("Provision took %v behind the hung counters", took)
	}
	// The usage flush reads the counters without the guest's lock: a use (which takes it)
	// during the read does not wait for it. (Under the lock, a cold make test's reads of up to
	// 2 s held off the timers, and the idle warning came seconds late.)
	<-reads // Provision's own, or an earlier flush's
	<-reads
	t1 := time.Now()
	n.Touch(s)
	if took := time.Since(t1); took > 500*time.Millisecond {
		t.Errorf("a use during the usage flush's read of the counters waited %v for it", took)
	}
	s, err := st.Transition(ctxT(t, 10*time.Second), store.Change{Project: project, ID: s.ID, From: session.Running,
		To: session.Stopping, Driver: session.Caller, Reason: session.Deleted})
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := n.Stop(ctxT(t, 2*time.Minute), s); err != nil {
		t.Fatal(err)
	}
	// One bounded read per sample, and a flush's may hold the lock first: seconds, never the
	// minutes of Stop's context.
	if took := time.Since(t0); took > 20*time.Second {
		t.Fatalf("Stop took %v behind the hung counters", took)
	}
	end, _ := waitState(t, st, project, s.ID, time.Minute, session.Stopped, session.Failed, session.Expired)
	checkEnded(t, end, session.Stopped, session.Deleted)
	if err := waitGuestGone(t, d, s.ID, 30*time.Second); err != nil {
		t.Error(err)
	}
}
