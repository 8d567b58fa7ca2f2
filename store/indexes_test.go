package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
)

// TestIndexes: the global indexes follow the sessions and snapshots they index, on every
// backend (the Cluster case proves no write spans two slots).
func TestIndexes(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.New(t)
			t.Run("ProvisionDeadlines", func(t *testing.T) { testProvisionDeadlines(t, New(rdb)) })
			t.Run("NodeSessions", func(t *testing.T) { testNodeSessions(t, New(rdb)) })
			t.Run("SnapshotProjects", func(t *testing.T) { testSnapshotProjects(t, New(rdb)) })
		})
	}
}

func ctxMinute(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// testProvisionDeadlines: Create records the deadline (created + the tier's), placement
// keeps it, leaving provisioning drops it; a create refused for its slot leaves none.
func testProvisionDeadlines(t *testing.T, s *Store) {
	ctx := ctxMinute(t)
	p := "proj_deadlines"
	a := mustCreate(t, s, newPending(p, ""), 2) // tier 2: 3 × 3 s
	ref := SessionRef{Project: p, ID: a.ID}
	at := a.CreatedAt.Add(9 * time.Second).Truncate(time.Millisecond)
	due, next, err := s.DueProvisionDeadlines(ctx, at.Add(-time.Millisecond), 10)
	if err != nil || len(due) != 0 || !next.Equal(at) {
		t.Fatalf("before the deadline: due %v next %v (want %v) %v", due, next, at, err)
	}
	due, _, err = s.DueProvisionDeadlines(ctx, at, 10)
	if err != nil || !slices.Equal(due, []SessionRef{ref}) {
		t.Fatalf("at the deadline: due %v %v", due, err)
	}
	mustCreate(t, s, newPending(p, ""), 2)
	refused := newPending(p, "")
	var ce *ConcurrencyError
	if _, err := s.Create(ctx, refused, 2); !errors.As(err, &ce) {
		t.Fatalf("third create: %v", err)
	}
	due, _, _ = s.DueProvisionDeadlines(ctx, time.Now().Add(time.Hour), 10)
	if slices.Contains(due, SessionRef{Project: p, ID: refused.ID}) || len(due) != 2 {
		t.Fatalf("a refused create left a deadline: %v", due)
	}
	if _, err := s.Transition(ctx, Change{Project: p, ID: a.ID, From: session.Pending, To: session.Provisioning,
		Driver: session.Placer, NodeID: "node_d"}); err != nil {
		t.Fatal(err)
	}
	if due, _, _ = s.DueProvisionDeadlines(ctx, at, 10); !slices.Contains(due, ref) {
		t.Fatal("placement dropped the provisioning deadline")
	}
	if _, err := s.Transition(ctx, Change{Project: p, ID: a.ID, From: session.Provisioning, To: session.Running,
		Driver: session.Node}); err != nil {
		t.Fatal(err)
	}
	if due, _, _ = s.DueProvisionDeadlines(ctx, at, 10); slices.Contains(due, ref) {
		t.Fatal("a running session keeps its provisioning deadline")
	}
	// More due than asked for: next is now.
	mustCreate(t, s, newPending(p, ""), 3)
	now := time.Now().Add(time.Hour)
	if due, next, _ = s.DueProvisionDeadlines(ctx, now, 1); len(due) != 1 || !next.Equal(now) {
		t.Fatalf("limit 1 of 2 due: %v next %v", due, next)
	}
}

// testNodeSessions: placing a session records it on its node, ending it drops it, and a
// placement that loses its compare-and-set leaves nothing.
func testNodeSessions(t *testing.T, s *Store) {
	ctx := ctxMinute(t)
	p := "proj_nodes"
	a := mustCreate(t, s, newPending(p, ""), 10)
	b := mustCreate(t, s, newPending(p, ""), 10)
	place := func(id string, version int64) error {
		_, err := s.Transition(ctx, Change{Project: p, ID: id, From: session.Pending, To: session.Provisioning,
			Driver: session.Placer, Version: version, NodeID: "node_n"})
		return err
	}
	if err := place(a.ID, 1); err != nil {
		t.Fatal(err)
	}
	var ce *ConflictError
	if err := place(b.ID, 7); !errors.As(err, &ce) {
		t.Fatalf("stale version: %v", err)
	}
	got, err := s.NodeSessions(ctx, "node_n")
	if err != nil || !slices.Equal(got, []SessionRef{{p, a.ID}}) {
		t.Fatalf("node's sessions %v %v, want only %s", got, err, a.ID)
	}
	// Placing again what is placed (another placer won the same node): the entry stays.
	if err := place(a.ID, 0); !errors.As(err, &ce) {
		t.Fatalf("placed twice: %v", err)
	}
	if got, _ = s.NodeSessions(ctx, "node_n"); len(got) != 1 {
		t.Fatalf("a lost placement of a placed session dropped it: %v", got)
	}
	if _, err := s.Transition(ctx, Change{Project: p, ID: a.ID, From: session.Provisioning, To: session.Failed,
		Driver: session.Node, Reason: session.StartFailure}); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.NodeSessions(ctx, "node_n"); len(got) != 0 {
		t.Fatalf("an ended session stays on its node: %v", got)
	}
}

// testSnapshotProjects: a recorded snapshot indexes its project; forgetting it keeps a
// project that still has snapshots; a full sweep restores a lost entry.
func testSnapshotProjects(t *testing.T, s *Store) {
	ctx := ctxMinute(t)
	p := "proj_snaps"
	if err := s.PutSnapshot(ctx, p, "snap_1", map[string]string{"id": "snap_1"}, 10, 10, 1000); err != nil {
		t.Fatal(err)
	}
	if err := s.PutObject(ctx, p, KindSnapshot, "snap_2", map[string]string{"id": "snap_2"}); err != nil {
		t.Fatal(err)
	}
	has := func() bool { ps, _ := s.SnapshotProjects(ctx); return slices.Contains(ps, p) }
	if !has() {
		t.Fatal("not indexed after a snapshot")
	}
	if err := s.DeleteObject(ctx, p, KindSnapshot, "snap_1"); err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetSnapshotProject(ctx, p); err != nil || !has() {
		t.Fatalf("forgotten with a snapshot left (%v)", err)
	}
	if err := s.DeleteObject(ctx, p, KindSnapshot, "snap_2"); err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetSnapshotProject(ctx, p); err != nil || has() {
		t.Fatalf("kept with no snapshot (%v)", err)
	}
	// An index write lost to a crash: the sweep finds the project again.
	if err := s.PutObject(ctx, p, KindSnapshot, "snap_3", map[string]string{"id": "snap_3"}); err != nil {
		t.Fatal(err)
	}
	if err := s.rdb.SRem(ctx, snapshotProjectsKey, p).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.IndexSnapshotProjects(ctx, []string{"proj_none", p}); err != nil || !has() {
		t.Fatalf("the sweep did not restore the entry (%v)", err)
	}
	active, err := s.ActiveProjects(ctx, []string{"proj_none", "proj_nodes", p})
	if err != nil || !slices.Equal(active, []string{"proj_nodes"}) {
		t.Fatalf("active projects %v %v", active, err)
	}
}

// TestTransitionRoundTrips: on one Redis a transition keeps the global indexes and signals
// the outbox in its own script, one round trip (an ending session takes one more, to leave
// its node's set); on a Cluster, where those keys are in other slots, every transition takes
// two. Each transition signals the outbox once either way.
func TestTransitionRoundTrips(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			s, rt, one := countedStore(t, b)
			ctx := ctxMinute(t)
			p := "proj_trips_" + b.Name
			withEndpoint(t, s, p)
			warm := mustCreate(t, s, newPending(p, ""), 10) // loads the script
			step(t, s, Change{Project: p, ID: warm.ID, From: session.Pending, To: session.Failed,
				Driver: session.Timer, Reason: session.ProvisionTimeout})
			takeSignals(t, ctx, s, WorkOutbox)
			a := mustCreate(t, s, newPending(p, ""), 10)
			if n := len(takeSignals(t, ctx, s, WorkOutbox)); n != 1 {
				t.Fatalf("%d outbox signals after a create", n)
			}
			for _, c := range []struct {
				change Change
				trips  int64
			}{
				{Change{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "node_t"}, one},
				{Change{From: session.Provisioning, To: session.Running, Driver: session.Node}, one},
				{Change{From: session.Running, To: session.Failed, Driver: session.Node, Reason: session.OOM}, 2},
			} {
				c.change.Project, c.change.ID = p, a.ID
				before := rt.Load()
				step(t, s, c.change)
				if n := rt.Load() - before; n != c.trips {
					t.Errorf("%s→%s took %d round trips, want %d", c.change.From, c.change.To, n, c.trips)
				}
			}
			if n := len(takeSignals(t, ctx, s, WorkOutbox)); n != 3 {
				t.Errorf("%d outbox signals after 3 transitions", n)
			}
			if got, _ := s.NodeSessions(ctx, "node_t"); len(got) != 0 {
				t.Errorf("an ended session stays on its node: %v", got)
			}
			if due, _, _ := s.DueProvisionDeadlines(ctx, time.Now().Add(time.Hour), 10); len(due) != 0 {
				t.Errorf("deadlines left: %v", due)
			}
		})
	}
}
