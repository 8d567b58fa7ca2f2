package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"wb/internal/redistest"
	"wb/session"
)

// TestPlan: the operator sets the plan; the tenant may only lower it, and a lowered value
// stays below a later plan; the limits in force are the smaller of the two.
func TestPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	p, _, err := s.CreateProject(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if p.Plan != DefaultPlan() || p.Granted != DefaultPlan() {
		t.Fatalf("new project's plan %+v / %+v", p.Plan, p.Granted)
	}

	// Raising any plan limit is refused and changes nothing.
	var pe *PlanLimitError
	err = s.LowerLimits(ctx, p.ID, PlanChange{Concurrency: ptr(100000)})
	if !errors.As(err, &pe) || pe.Field != "concurrency" || pe.Plan != DefaultConcurrency || pe.Asked != 100000 {
		t.Fatalf("raise concurrency: %v", err)
	}
	err = s.LowerLimits(ctx, p.ID, PlanChange{Concurrency: ptr(5), NodeSharePct: ptr(100)})
	if !errors.As(err, &pe) || pe.Field != "node_share_pct" {
		t.Fatalf("raise node share: %v", err)
	}
	if got, _ := s.GetProject(ctx, p.ID); got.Concurrency != DefaultConcurrency {
		t.Fatalf("a refused change half-applied: %+v", got.Plan)
	}
	var fe *session.FieldError
	if err := s.LowerLimits(ctx, p.ID, PlanChange{SnapshotCount: ptr(-1)}); !errors.As(err, &fe) || fe.Field != "snapshot_count" {
		t.Fatalf("negative: %v", err)
	}

	// Lowering works, and survives the operator raising the plan.
	if err := s.LowerLimits(ctx, p.ID, PlanChange{Concurrency: ptr(5), SnapshotGiB: ptr(1)}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPlan(ctx, p.ID, PlanChange{Concurrency: ptr(1000), RatePerSec: ptr(7)}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetProject(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Concurrency != 5 || got.SnapshotGiB != 1 || got.RatePerSec != 7 || got.Granted.Concurrency != 1000 || got.Granted.SnapshotGiB != DefaultSnapshotGiB {
		t.Fatalf("after lowering and a new plan: in force %+v, granted %+v", got.Plan, got.Granted)
	}
	// The operator lowering the plan below the tenant's value wins.
	if err := s.SetPlan(ctx, p.ID, PlanChange{Concurrency: ptr(2)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetProject(ctx, p.ID); got.Concurrency != 2 {
		t.Fatalf("plan below the tenant's value: %d in force", got.Concurrency)
	}
	// Setting a limit back to the plan's value follows the plan again.
	if err := s.SetPlan(ctx, p.ID, PlanChange{Concurrency: ptr(1000)}); err != nil {
		t.Fatal(err)
	}
	if err := s.LowerLimits(ctx, p.ID, PlanChange{Concurrency: ptr(1000)}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPlan(ctx, p.ID, PlanChange{Concurrency: ptr(2000)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetProject(ctx, p.ID); got.Concurrency != 2000 {
		t.Fatalf("back at the plan's value, then a bigger plan: %d in force", got.Concurrency)
	}

	if err := s.SetPlan(ctx, p.ID, PlanChange{NodeSharePct: ptr(0)}); !errors.As(err, &fe) || fe.Field != "node_share_pct" {
		t.Fatalf("node share 0: %v", err)
	}
	if err := s.SetPlan(ctx, "proj_none", PlanChange{Concurrency: ptr(1)}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("plan of a missing project: %v", err)
	}
}

// TestUsageAgainstPlan: snapshot count and bytes, and what a project's sessions hold per node.
func TestUsageAgainstPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	const p = "proj_u"
	for id, size := range map[string]int64{"snap_a": 1 << 30, "snap_b": 5} {
		if err := s.PutObject(ctx, p, KindSnapshot, id, map[string]any{"id": id, "size_bytes": size}); err != nil {
			t.Fatal(err)
		}
	}
	if n, b, err := s.SnapshotUsage(ctx, p); err != nil || n != 2 || b != 1<<30+5 {
		t.Fatalf("snapshot usage %d %d %v", n, b, err)
	}

	a := mustCreate(t, s, newPending(p, ""), 10)
	b := mustCreate(t, s, newPending(p, ""), 10)
	mustCreate(t, s, newPending(p, ""), 10) // pending: on no node
	for _, id := range []string{a.ID, b.ID} {
		step(t, s, Change{Project: p, ID: id, From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"})
	}
	step(t, s, Change{Project: p, ID: b.ID, From: session.Provisioning, To: session.Failed, Driver: session.Node, Reason: session.StartFailure})
	use, err := s.NodeUsage(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(use) != 1 || use["n1"] != (NodeUse{VCPU: 1, MemoryMiB: 2048}) {
		t.Fatalf("node usage %+v", use)
	}
}

// TestPutSnapshotWithinPlan: snapshots recorded at once, as through several gateways, never
// pass the plan's count or bytes together; rewriting a recorded snapshot takes no new room.
func TestPutSnapshotWithinPlan(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			project := "proj_snaps_" + b.Name
			type snap struct {
				ID        string `json:"id"`
				SizeBytes int64  `json:"size_bytes"`
			}
			var wg sync.WaitGroup
			var ok, refused atomic.Int32
			for i := range 12 {
				wg.Go(func() {
					id := fmt.Sprintf("snap_%02d", i)
					err := s.PutSnapshot(ctx, project, id, snap{id, 1 << 30}, 1<<30, 3, 100<<30)
					var le *SnapshotLimitError
					switch {
					case err == nil:
						ok.Add(1)
					case errors.As(err, &le) && le.Limit == "snapshot_count":
						refused.Add(1)
					default:
						t.Errorf("%s: %v", id, err)
					}
				})
			}
			wg.Wait()
			if ok.Load() != 3 || refused.Load() != 9 {
				t.Fatalf("%d recorded, %d refused; want 3 and 9", ok.Load(), refused.Load())
			}
			n, used, err := s.SnapshotUsage(ctx, project)
			if err != nil || n != 3 || used != 3<<30 {
				t.Fatalf("usage %d, %d, %v", n, used, err)
			}
			// Bytes: 3 GiB kept, 4 GiB allowed, a 2 GiB snapshot does not fit.
			err = s.PutSnapshot(ctx, project, "snap_big", snap{"snap_big", 2 << 30}, 2<<30, 10, 4<<30)
			var le *SnapshotLimitError
			if !errors.As(err, &le) || le.Limit != "snapshot_gib" || le.Count != 3 || le.Bytes != 3<<30 {
				t.Fatalf("over bytes: %v", err)
			}
			// A recorded snapshot rewritten (its state changes) needs no new slot.
			ids, _, err := s.ListObjects(ctx, project, KindSnapshot, 10, "")
			if err != nil || len(ids) != 3 {
				t.Fatalf("list: %d, %v", len(ids), err)
			}
			var first snap
			if err := json.Unmarshal(ids[0], &first); err != nil {
				t.Fatal(err)
			}
			if err := s.PutSnapshot(ctx, project, first.ID, first, first.SizeBytes, 3, 3<<30); err != nil {
				t.Fatalf("rewrite %s at the count limit: %v", first.ID, err)
			}
		})
	}
}
