package node_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor/templates"
	"wb/internal/proc"
	"wb/node"
	"wb/session"
)

// sizeS is exactly the size class "s": only such a session claims a pooled guest.
func sizeS() session.Resources {
	c := session.SizeClasses()[0]
	return session.Resources{VCPU: c.VCPU, MemoryMiB: c.MemoryMiB, DiskGiB: c.DiskGiB, SizeClass: c.Name}
}

func awaitPool(t *testing.T, n *node.Node, want int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for n.PoolReady(templates.Base, "s") != want {
		if time.Now().After(deadline) {
			t.Fatalf("the warm pool holds %d guests, want %d", n.PoolReady(templates.Base, "s"), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWarmPoolWarmUp: a pool's warm-up runs in each guest before it joins the pool, so that a
// session claiming one finds what the warm-up started (a desktop finds its browser running);
// a guest whose warm-up fails never joins.
func TestWarmPoolWarmUp(t *testing.T) {
	t.Parallel()
	t.Run("claimed warm", func(t *testing.T) {
		t.Parallel()
		st, _ := newStore(t)
		d := newDriver(t, "runc", tempDir(t))
		cfg := nodeConfig(t, st, d, tempDir(t), "node_warm")
		var warmed atomic.Int32
		cfg.Pools = []node.Pool{{Template: templates.Base, SizeClass: "s", Size: 1,
			Warm: func(ctx context.Context, ex node.Execer) error {
				_, stderr, code, err := ex.Exec(ctx, []string{"sh", "-c", "echo warmed-up > warm.txt"}, nil)
				if err == nil && code != 0 {
					err = errors.New(string(stderr))
				}
				warmed.Add(1)
				return err
			}}}
		n := startNode(t, cfg)
		awaitPool(t, n.Node, 1)
		s := provision(t, st, n.Node, "proj_warm", sessionOpts{res: sizeS(), idleS: 600, lifeS: 600})
		res, err := execIn(ctxT(t, time.Minute), n.Node, s, "cat warm.txt")
		if err != nil || strings.TrimSpace(res.Stdout) != "warmed-up" {
			t.Fatalf("the claimed guest has %q (%v, stderr %q): it was not the warmed one", res.Stdout, err, res.Stderr)
		}
		if warmed.Load() < 1 {
			t.Fatal("the warm-up never ran")
		}
	})
	t.Run("warm-up fails", func(t *testing.T) {
		t.Parallel()
		st, _ := newStore(t)
		d := newDriver(t, "runc", tempDir(t))
		cfg := nodeConfig(t, st, d, tempDir(t), "node_cold")
		var tries atomic.Int32
		cfg.Pools = []node.Pool{{Template: templates.Base, SizeClass: "s", Size: 1,
			Warm: func(ctx context.Context, ex node.Execer) error { tries.Add(1); return errors.New("no display") }}}
		n := startNode(t, cfg)
		deadline := time.Now().Add(3 * time.Minute)
		for tries.Load() < 2 { // it failed, and the pool tried again
			if time.Now().After(deadline) {
				t.Fatalf("the warm-up ran %d times", tries.Load())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got := n.PoolReady(templates.Base, "s"); got != 0 {
			t.Errorf("%d guests joined the pool after their warm-up failed", got)
		}
		// The failed guests are gone: only ever one at a time exists.
		if ids, err := d.List(ctxT(t, 30*time.Second)); err != nil || len(ids) > 1 {
			t.Errorf("guests left behind by failed warm-ups: %v (%v)", ids, err)
		}
	})
}

// TestWarmClaimReusesAgentConnection: a warm claim's session reaches the guest's agent over
// the connection the pool's boot opened (a new connection into a gVisor guest costs an
// accept in the sandbox), and the pool refills once the claim is served.
func TestWarmClaimReusesAgentConnection(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	d := newDriver(t, "runc", tempDir(t))
	dataDir := tempDir(t)
	cfg := nodeConfig(t, st, d, dataDir, "node_warm_conn")
	dials := &atomic.Int64{}
	cfg.Driver = dialingDriver{timedDriver: cfg.Driver.(timedDriver), dataDir: dataDir, dials: dials}
	cfg.Pools = []node.Pool{{Template: templates.Base, SizeClass: "s", Size: 1}}
	n := startNode(t, cfg)
	awaitPool(t, n.Node, 1)
	before := dials.Load()
	s := provision(t, st, n.Node, "proj_warm_conn", sessionOpts{res: sizeS(), idleS: 600, lifeS: 600})
	if got := get(t, st, "proj_warm_conn", s.ID); got.State != session.Running || got.ColdStart == nil || *got.ColdStart {
		t.Fatalf("session %s (cold_start %v), want a running warm start", got.State, got.ColdStart)
	}
	if after := dials.Load(); after != before {
		t.Fatalf("the warm claim dialled the agent %d times, want 0 (the pool's connection)", after-before)
	}
	res, err := execIn(ctxT(t, time.Minute), n.Node, s, "echo warm")
	if err != nil || strings.TrimSpace(res.Stdout) != "warm" {
		t.Fatalf("exec = %+v, %v", res, err)
	}
	awaitPool(t, n.Node, 1)
}

// TestWarmClaimWaitsForBootInFlight: a claim that finds the pool empty while its boot is in
// flight waits for that guest rather than start its own cold.
func TestWarmClaimWaitsForBootInFlight(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	d := newDriver(t, "runc", tempDir(t))
	cfg := nodeConfig(t, st, d, tempDir(t), "node_warm_inflight")
	started, release := make(chan struct{}, 1), make(chan struct{})
	cfg.Pools = []node.Pool{{Template: templates.Base, SizeClass: "s", Size: 1,
		Warm: func(ctx context.Context, ex node.Execer) error {
			select {
			case started <- struct{}{}:
			default:
			}
			select { // the first boot stays in flight until the claim below has begun
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}}}
	n := startNode(t, cfg)
	select {
	case <-started:
	case <-time.After(3 * time.Minute):
		t.Fatal("the pool's first boot never reached its warm-up")
	}
	time.AfterFunc(time.Second, func() { close(release) }) // well within firstBootWait (5 s)
	s := provision(t, st, n.Node, "proj_warm_inflight", sessionOpts{res: sizeS(), idleS: 600, lifeS: 600})
	if got := get(t, st, "proj_warm_inflight", s.ID); got.ColdStart == nil || *got.ColdStart {
		t.Fatal("the session started cold; want the guest whose boot was in flight")
	}
}

// TestWarmClaimOfDeadGuest: a warm guest that died while it waited in the pool is not
// claimed: the session starts cold and runs, and the dead guest is cleaned up.
func TestWarmClaimOfDeadGuest(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	d := newDriver(t, "runc", tempDir(t))
	cfg := nodeConfig(t, st, d, tempDir(t), "node_warm_dead")
	cfg.Pools = []node.Pool{{Template: templates.Base, SizeClass: "s", Size: 1}}
	n := startNode(t, cfg)
	awaitPool(t, n.Node, 1)
	ids, err := d.List(ctxT(t, 30*time.Second))
	if err != nil || len(ids) != 1 {
		t.Fatalf("guests %v (%v), want the one warm guest", ids, err)
	}
	warm := ids[0]
	info, err := d.Info(ctxT(t, 30*time.Second), warm)
	if err != nil || info.Pid <= 0 {
		t.Fatalf("warm guest %s: %+v, %v", warm, info, err)
	}
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); proc.Alive(info.Pid, ""); {
		if time.Now().After(deadline) {
			t.Fatalf("warm guest %s's process %d outlived SIGKILL by a minute", warm, info.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s := provision(t, st, n.Node, "proj_warm_dead", sessionOpts{res: sizeS(), idleS: 600, lifeS: 600})
	if s.ColdStart == nil || !*s.ColdStart {
		t.Fatalf("the session claimed the dead warm guest (cold_start %v)", s.ColdStart)
	}
	res, err := execIn(ctxT(t, time.Minute), n.Node, s, "echo cold")
	if err != nil || strings.TrimSpace(res.Stdout) != "cold" {
		t.Fatalf("exec = %+v, %v", res, err)
	}
	if err := guestGone(t, d, warm); err != nil { // destroyed before the cold start
		t.Fatal(err)
	}
}
