package placer

import (
	"context"
	"testing"
	"time"

	"wb/session"
	"wb/store"
)

// TestRestoreNeedsImage: a memory snapshot's restore goes to a node that has the root disk
// image its guest ran on, though another node would be preferred (n_big has far more free
// memory); a disk snapshot's, or one of a snapshot that names no image, goes where any session
// would. With no live node having the image, the restore stays pending (the gateway refuses
// it before: checkRestorable), and a node that advertises no images (an earlier wb's) is not
// taken for one.
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
	if got, err := st.Get(ctx, "proj_a", none.ID); err != nil || got.State != session.Pending {
		t.Fatalf("a restore no node can do: %+v, %v; want it pending", got, err)
	}

	// The node with the image gone, and the other one rolled back to a wb that advertises no
	// images: the restore stays pending.
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
}
