package placer

import (
	"context"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// TestRestoreNeedsImage: a memory snapshot's restore goes to a node that has the root disk
// image its guest ran on, though another node would be preferred (n_big has far more free
// memory); a disk snapshot's, or one of a snapshot that names no image, goes where any session
// would. With no live node having the image (the gateway refuses such a create before:
// checkRestorable), the restore fails at once with start_failure, and a node that advertises
// no images (an earlier wb's) is not taken for one.
func TestRestoreNeedsImage(t *testing.T) {
	st, rec, p, _ := setup(t)
	ctx := context.Background()
	for _, n := range []store.NodeInfo{
		{ID: "n_small", Region: "r1", Zone: "r1-a", Tiers: []int{1, 2}, VCPU: 4, MemoryMiB: 4096, Images: []string{"rootfs-a/uuid-a"}},
		{ID: "n_big", Region: "r1", Zone: "r1-b", Tiers: []int{2, 3}, VCPU: 16, MemoryMiB: 65536, UsedMemoryMiB: 40000, Images: []string{"rootfs-a/uuid-b"}},
	} {
		if err := st.Heartbeat(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	snap := func(id string, memory bool, img string) {
		t.Helper()
		rec := session.SnapshotRecord{Snapshot: session.Snapshot{ID: id, Object: "snapshot", SessionID: "sess_x", IncludeMemory: memory,
			State: session.SnapshotReady, Template: "tpl_base@sha256:x", Tier: 2}, RootImage: img}
		if err := st.PutObject(ctx, "proj_a", store.KindSnapshot, id, rec); err != nil {
			t.Fatal(err)
		}
	}
	snap("snap_mema", true, "rootfs-a/uuid-a")
	snap("snap_disk", false, "")
	snap("snap_old", true, "") // an earlier wb's, or another back end's
	snap("snap_none", true, "rootfs-a/uuid-gone")
	restore := func(from string) *session.Session {
		t.Helper()
		now := time.Now()
		s := &session.Session{ID: session.NewID("sess_", now), Tier: 2, State: session.Pending, ProjectID: "proj_a",
			Template: "tpl_base@sha256:x", Region: "r1", CreatedAt: *session.At(now), IdleTimeoutS: 300, MaxLifetimeS: 3600,
			Resources: session.Resources{VCPU: 1, MemoryMiB: 512, DiskGiB: 1, SizeClass: "s"}, RestoreFrom: &from}
		out, err := st.Create(ctx, s, 100)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	mem, disk, old, none := restore("snap_mema"), restore("snap_disk"), restore("snap_old"), restore("snap_none")
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	for id, want := range map[string]string{mem.ID: "n_small", disk.ID: "n_big", old.ID: "n_big", none.ID: ""} {
		if got := rec.nodeOf(id); got != want {
			t.Errorf("%s placed on %q, want %q", id, got, want)
		}
	}
	failed := func(id string) {
		t.Helper()
		got, err := st.Get(ctx, "proj_a", id)
		if err != nil || got.State != session.Failed || got.StateReason == nil || *got.StateReason != session.StartFailure {
			t.Fatalf("a restore no node can do: %+v, %v; want it failed with start_failure", got, err)
		}
	}
	failed(none.ID)

	// The node with the image gone, and the other one rolled back to a wb that advertises no
	// images: the restore fails.
	if err := st.RemoveNode(ctx, "n_small"); err != nil {
		t.Fatal(err)
	}
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "n_big", Region: "r1", Zone: "r1-b", Tiers: []int{2, 3}, VCPU: 16, MemoryMiB: 65536}); err != nil {
		t.Fatal(err)
	}
	again := restore("snap_mema")
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	if got := rec.nodeOf(again.ID); got != "" {
		t.Errorf("a restore of snap_mema with no node having its image was placed on %q", got)
	}
	failed(again.ID)
}

// TestRestoreNoHostFails: a memory snapshot's restore that no live node can take any more (the
// only node with its root disk image died after the gateway's create checked it: its heartbeat
// lapsed, the node not yet removed) fails at once, with start_failure, rather than wait
// pending until its provisioning deadline. One whose node with the image lives but has no room
// waits, as any session does; so does one while the placer counts heartbeats from a stall of
// its own (it could not have read the node's meanwhile).
func TestRestoreNoHostFails(t *testing.T) {
	rdb := redistest.Server(t)
	st, rec, p, now := setupOn(t, rdb)
	ctx := context.Background()
	const img = "rootfs-a/uuid-a"
	small := store.NodeInfo{ID: "n_small", Region: "r1", Zone: "r1-a", Tiers: []int{1, 2}, VCPU: 4, MemoryMiB: 4096, Images: []string{img}}
	for _, n := range []store.NodeInfo{small,
		{ID: "n_big", Region: "r1", Zone: "r1-b", Tiers: []int{2, 3}, VCPU: 16, MemoryMiB: 65536, UsedMemoryMiB: 40000, Images: []string{"rootfs-a/uuid-b"}},
	} {
		if err := st.Heartbeat(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	snap := session.SnapshotRecord{Snapshot: session.Snapshot{ID: "snap_mema", Object: "snapshot", SessionID: "sess_x", IncludeMemory: true,
		State: session.SnapshotReady, Template: "tpl_base@sha256:x", Tier: 2}, RootImage: img}
	if err := st.PutObject(ctx, "proj_a", store.KindSnapshot, snap.ID, snap); err != nil {
		t.Fatal(err)
	}
	restore := func(mem int) *session.Session {
		t.Helper()
		at := time.Now()
		s := &session.Session{ID: session.NewID("sess_", at), Tier: 2, State: session.Pending, ProjectID: "proj_a",
			Template: "tpl_base@sha256:x", Region: "r1", CreatedAt: *session.At(at), IdleTimeoutS: 300, MaxLifetimeS: 3600,
			Resources: session.Resources{VCPU: 1, MemoryMiB: mem, DiskGiB: 1, SizeClass: "s"}, RestoreFrom: &snap.ID}
		out, err := st.Create(ctx, s, 100)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	state := func(id string) (session.State, string) {
		t.Helper()
		got, err := st.Get(ctx, "proj_a", id)
		if err != nil {
			t.Fatal(err)
		}
		if got.StateReason == nil {
			return got.State, ""
		}
		return got.State, string(*got.StateReason)
	}
	place := func() {
		p.PlaceProject(ctx, "proj_a")
		p.wg.Wait()
	}

	// The node with the image lives: a restore that fits goes there, one too big for it waits.
	fits, tooBig := restore(512), restore(8192)
	place()
	if got := rec.nodeOf(fits.ID); got != "n_small" {
		t.Fatalf("the restore went to %q, want n_small (the one with the image)", got)
	}
	if st, why := state(tooBig.ID); st != session.Pending {
		t.Fatalf("a restore too big for the node with the image: %s (%s); want it pending, as any session without room", st, why)
	}

	// n_small dies: its last heartbeat is a minute old, and no check of the nodes removed it yet.
	dead := store.New(rdb, store.WithClock(func() time.Time { return time.Now().Add(-time.Minute) }))
	if err := dead.Heartbeat(ctx, small); err != nil {
		t.Fatal(err)
	}
	// A placer that has just woken from a stall counts the node's heartbeat from then: it
	// waits, as for the node's other sessions (checkNodes).
	p.noteStall(*now, time.Minute)
	stalled := restore(512)
	place()
	if st, why := state(stalled.ID); st != session.Pending || rec.nodeOf(stalled.ID) != "" {
		t.Fatalf("a restore the placer cannot judge yet (it woke from a stall): %s (%s) on %q; want it pending", st, why, rec.nodeOf(stalled.ID))
	}
	*now = now.Add(time.Minute) // the stall's heartbeat timeout is over

	gone := restore(512)
	place()
	for _, s := range []*session.Session{gone, tooBig, stalled} {
		if st, why := state(s.ID); st != session.Failed || why != string(session.StartFailure) {
			t.Errorf("a restore no live node can take any more: %s (%s); want failed at once with start_failure", st, why)
		}
		if got := rec.nodeOf(s.ID); got != "" {
			t.Errorf("a restore no live node can take was placed on %q", got)
		}
	}
}
