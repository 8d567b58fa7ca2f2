package node_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/quota"
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

// TestPauseBillsTheFreezeRunningAndTheThawPaused: a guest is billed as running until the
// driver has frozen it and as paused until the driver has thawed it, so a host slow to do
// either bills what the guest did meanwhile. The driver here takes 100 s to freeze and 300 s
// to thaw, on the node's clock.
func TestPauseBillsTheFreezeRunningAndTheThawPaused(t *testing.T) {
	t.Parallel()
	st, rp := newStore(t)
	d := newDriver(t, "runc", tempDir(t))
	var offset atomic.Int64
	cfg := nodeConfig(t, st, d, tempDir(t), "node_pause_bill")
	cfg.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	cfg.Driver = slowFreeze{Driver: cfg.Driver, offset: &offset, freeze: 100 * time.Second, thaw: 300 * time.Second}
	n := startNode(t, cfg)
	const project = "proj_pause_bill"
	began := time.Now()
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 7200, lifeS: 21600})
	ctx := ctxT(t, time.Minute)
	if err := n.Pause(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition(ctx, store.Change{Project: project, ID: s.ID, From: session.Running, To: session.Paused, Driver: session.Caller}); err != nil {
		t.Fatal(err)
	}
	if err := n.Resume(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Transition(ctx, store.Change{Project: project, ID: s.ID, From: session.Paused, To: session.Running, Driver: session.Caller}); err != nil {
		t.Fatal(err)
	}
	deleteSession(t, st, n.Node, project, s.ID)
	rdb := redisClient(t, rp.Addr())
	var running, paused time.Duration
	for {
		running, paused = 0, 0
		msgs, err := rdb.XRange(ctx, store.ProjectKeys(project).UsageStream(), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if r, err := quota.DecodeRecord(m.Values); err == nil && r.SessionID == s.ID {
				running += time.Duration(r.SessionMs) * time.Millisecond
				paused += time.Duration(r.PausedMs) * time.Millisecond
			}
		}
		if running+paused >= 400*time.Second {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the session's usage records sum to %s running and %s paused, want 400 s at least", running, paused)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// What else the guest did took real time, at most the test's.
	elapsed := time.Since(began)
	if running < 100*time.Second || running > 100*time.Second+elapsed {
		t.Errorf("billed %s running, want the 100 s freeze and up to %s more", running, elapsed)
	}
	if paused < 300*time.Second || paused > 300*time.Second+elapsed {
		t.Errorf("billed %s paused, want the 300 s thaw and up to %s more", paused, elapsed)
	}
}

// slowFreeze is a driver whose pause and resume move the node's clock (offset) on.
type slowFreeze struct {
	hypervisor.Driver
	offset       *atomic.Int64
	freeze, thaw time.Duration
}

func (d slowFreeze) Pause(ctx context.Context, id string) error {
	err := d.Driver.Pause(ctx, id)
	d.offset.Add(int64(d.freeze))
	return err
}

func (d slowFreeze) Resume(ctx context.Context, id string) error {
	err := d.Driver.Resume(ctx, id)
	d.offset.Add(int64(d.thaw))
	return err
}
