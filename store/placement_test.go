package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
)

// TestLockPlacement: one placer holds a project's placement at a time; a placer turned away
// gets the holder to place another round; a lock whose holder died expires with its lease;
// a project with nothing pending is not locked, nor its holder asked for a round.
func TestLockPlacement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	s := New(rdb)
	for _, p := range []string{"proj_x", "proj_y"} {
		if err := rdb.ZAdd(ctx, ProjectKeys(p).byState(session.Pending), redis.Z{Member: "sess_1"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if l, pending, err := s.LockPlacement(ctx, "proj_idle"); err != nil || l != nil || pending {
		t.Fatalf("lock of a project with nothing pending: %v, pending %v, %v; want none", l, pending, err)
	}

	a, _, err := s.LockPlacement(ctx, "proj_x")
	if err != nil || a == nil {
		t.Fatalf("first lock: %v, %v", a, err)
	}
	other, _, err := s.LockPlacement(ctx, "proj_y")
	if err != nil || other == nil {
		t.Fatalf("another project's lock: %v, %v", other, err)
	}
	// Nothing pending: a held lock's holder is not asked for a round it has no work for.
	if err := rdb.Del(ctx, ProjectKeys("proj_y").byState(session.Pending)).Err(); err != nil {
		t.Fatal(err)
	}
	if l, pending, _ := s.LockPlacement(ctx, "proj_y"); l != nil || pending {
		t.Fatalf("lock of proj_y with nothing pending: %v, pending %v", l, pending)
	}
	if again, err := other.Done(ctx); err != nil || again {
		t.Fatalf("proj_y's holder: again=%v, %v; want no round asked for", again, err)
	}
	b, pending, err := s.LockPlacement(ctx, "proj_x")
	if err != nil || b != nil || !pending {
		t.Fatalf("second lock while held: %v, pending %v, %v", b, pending, err)
	}
	if again, err := a.Done(ctx); err != nil || !again {
		t.Fatalf("holder after a turned-away placer: again=%v, %v; want another round", again, err)
	}
	if b, _, _ := s.LockPlacement(ctx, "proj_x"); b != nil {
		t.Fatal("the lock was released although another round was due")
	}
	// That refusal asked for a round again; the holder places it, then the lock is free.
	if again, _ := a.Done(ctx); !again {
		t.Fatal("the second request for a round was lost")
	}
	if again, err := a.Done(ctx); err != nil || again {
		t.Fatalf("quiet round: again=%v, %v", again, err)
	}
	c, _, err := s.LockPlacement(ctx, "proj_x")
	if err != nil || c == nil {
		t.Fatalf("lock after release: %v, %v", c, err)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A holder that died: the lease runs out, and its late Done is told it lost the lock.
	d, _, _ := s.LockPlacement(ctx, "proj_x")
	mr.FastForward(PlacementLease + time.Second)
	if e, _, _ := s.LockPlacement(ctx, "proj_x"); e == nil {
		t.Fatal("an expired lock still held")
	}
	if _, err := d.Done(ctx); err == nil {
		t.Fatal("a lost lock's Done answered no error")
	}
}

// TestReadPlacement: a placement round's view holds the project's pending sessions (up to
// most, saying when there are more), the nodes, the project's plan, what its placed sessions
// hold per node, and the live claims of the candidate nodes only; on every backend (in a
// cluster the nodes' keys and the project's live in different slots).
func TestReadPlacement(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			const p = "proj_view"
			now := time.Now()
			const window = 10 * time.Second
			live := func(n NodeInfo) bool { return n.ID != "n_dead" }
			if _, err := s.ReadPlacement(ctx, p, 5, now, window, live); !errors.Is(err, ErrNotFound) {
				t.Fatalf("view of a missing project: %v, want not found", err)
			}
			if _, err := s.EnsureProject(ctx, p, "view"); err != nil {
				t.Fatal(err)
			}
			for _, n := range []NodeInfo{{ID: "n1", Region: "local", VCPU: 8, MemoryMiB: 8192}, {ID: "n_dead", Region: "local", VCPU: 8, MemoryMiB: 8192}} {
				if err := s.Heartbeat(ctx, n); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.SetNodeDraining(ctx, "n1", true); err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{"n1", "n_dead"} {
				if _, ok, err := s.ClaimOnNode(ctx, ClaimAsk{Node: NodeInfo{ID: n, VCPU: 8, MemoryMiB: 8192}, Session: "sess_other", VCPU: 1, MemoryMiB: 512}, now, window); err != nil || !ok {
					t.Fatalf("claim on %s: %v, %v", n, ok, err)
				}
			}
			v, err := s.ReadPlacement(ctx, p, 5, now, window, live)
			if err != nil || len(v.Pending) != 0 || v.More || len(v.Usage) != 0 {
				t.Fatalf("view with nothing pending: %+v, %v", v, err)
			}
			placed := mustCreate(t, s, newPending(p, ""), 10)
			step(t, s, Change{Project: p, ID: placed.ID, From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"})
			a := mustCreate(t, s, newPending(p, ""), 10)
			c := mustCreate(t, s, newPending(p, ""), 10)

			v, err = s.ReadPlacement(ctx, p, 5, now, window, live)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, sess := range v.Pending {
				ids = append(ids, sess.ID)
			}
			slices.Sort(ids)
			want := []string{a.ID, c.ID}
			slices.Sort(want)
			if !slices.Equal(ids, want) || v.More {
				t.Fatalf("pending %v (more %v), want %v", ids, v.More, want)
			}
			if v.Project.ID != p || v.Project.NodeSharePct == 0 {
				t.Fatalf("project %+v", v.Project)
			}
			if len(v.Nodes) != 2 {
				t.Fatalf("nodes %+v, want n1 and n_dead", v.Nodes)
			}
			for _, n := range v.Nodes {
				if n.Draining != (n.ID == "n1") {
					t.Fatalf("node %s draining %v", n.ID, n.Draining)
				}
			}
			if len(v.Usage) != 1 || v.Usage["n1"] != (NodeUse{VCPU: 1, MemoryMiB: 2048}) {
				t.Fatalf("usage %+v, want the placed session's on n1", v.Usage)
			}
			if len(v.Claims) != 1 || v.Claims["n1"] != (NodeUse{VCPU: 1, MemoryMiB: 512}) {
				t.Fatalf("claims %+v, want n1's only (n_dead is no candidate)", v.Claims)
			}
			if v, err = s.ReadPlacement(ctx, p, 1, now, window, live); err != nil || len(v.Pending) != 1 || !v.More {
				t.Fatalf("view of at most 1: %+v, %v; want one pending and more", v, err)
			}
		})
	}
}
