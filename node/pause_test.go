package node_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"wb/session"
	"wb/store"
)

// TestPauseLimit: a session paused for more than an hour is stopped (idle_timeout), on the
// node's own clock; a shorter pause is left alone.
func TestPauseLimit(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{"runc", "cloudhv"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			testPauseLimit(t, rt)
		})
	}
}

func testPauseLimit(t *testing.T, rt string) {
	st, _ := newStore(t)
	d := newDriver(t, rt, tempDir(t))
	var offset atomic.Int64
	cfg := nodeConfig(t, st, d, tempDir(t), "node_pause")
	cfg.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	n := startNode(t, cfg)
	s := provision(t, st, n.Node, "proj_pause", sessionOpts{idleS: 7200, lifeS: 21600})
	// What the gateway does for POST :pause: the guest, then the state.
	if err := n.Pause(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition(context.Background(), store.Change{Project: "proj_pause", ID: s.ID, From: session.Running,
		To: session.Paused, Driver: session.Caller}); err != nil {
		t.Fatal(err)
	}
	offset.Store(int64(59 * time.Minute))
	// The point: the node's loop runs with the clock at 59 minutes and must not end the
	// session. 40 ticks give a busy machine's loop room to run several times.
	time.Sleep(40 * tick)
	if got := get(t, st, "proj_pause", s.ID); got.State != session.Paused {
		t.Fatalf("a 59-minute pause ended the session: %s", got.State)
	}
	offset.Store(int64(session.PauseMax + time.Minute))
	got, _ := waitState(t, st, "proj_pause", s.ID, 30*time.Second, session.Stopped)
	if got.StateReason == nil || *got.StateReason != session.IdleTimeout {
		t.Fatalf("stopped for %s, want idle_timeout", reasonOf(got))
	}
}
