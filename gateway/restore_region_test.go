package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"wb/session"
	"wb/store"
)

// TestRestoreImageOtherRegion: a memory snapshot's restore is refused at the create (a 400 on
// restore_from naming the session's region) when the only live nodes with its root image are
// in another region, or offer no room of the session's tier, as when no node has the image:
// the placer places a session only on a node of its region that offers its tier, so it would
// wait pending until its provisioning deadline. A node of the region, with the tier and the
// image, takes it.
func TestRestoreImageOtherRegion(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if err := e.node.SetImages(ctx, "rootfs-1.ext4/uuid-a"); err != nil {
		t.Fatal(err)
	}
	s := e.running(map[string]any{"tier": 2})
	var mem session.Snapshot
	e.mustDo("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, map[string]any{"include_memory": true}, 201, &mem)
	e.waitState(e.key, s.ID, session.Running)
	// The node that took it leaves.
	if err := e.st.SetNodeDraining(ctx, "node_fake", true); err != nil {
		t.Fatal(err)
	}
	refused := func(what string) {
		t.Helper()
		r := e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "restore_from": mem.ID})
		if r.status == 400 {
			msg := expectError(t, r, 400, "invalid_request", "restore_from")
			if !strings.Contains(msg, mem.ID) || !strings.Contains(msg, `"local"`) {
				t.Errorf("%s: refusal %s: want the snapshot and the region named", what, msg)
			}
			t.Logf("%s: refused: %s", what, msg)
			return
		}
		var created session.Session
		if err := json.Unmarshal(r.body, &created); err != nil {
			t.Fatalf("%s: create: %d %s", what, r.status, r.body)
		}
		// Show where it went: nowhere, while the nodes beat.
		var got session.Session
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			e.mustDo("GET", "/v1/sessions/"+created.ID, e.key, nil, 200, &got)
			if got.NodeID != "" {
				break
			}
		}
		t.Fatalf("%s: %d, the session %s on node %q; want a 400 on restore_from (no node of region %q offering tier 2 can restore it)",
			what, r.status, got.State, got.NodeID, got.Region)
	}
	beat := func(n store.NodeInfo) {
		t.Helper()
		if err := e.st.Heartbeat(ctx, n); err != nil {
			t.Fatal(err)
		}
	}

	// A live node of another region has the image.
	x := store.NodeInfo{ID: "node_x", Addr: "127.0.0.1:0", Region: "elsewhere", Zone: "elsewhere-a", Tiers: []int{1, 2, 3, 4},
		VCPU: 1000, MemoryMiB: 1_000_000, Images: []string{"rootfs-1.ext4/uuid-a"}}
	beat(x)
	refused("image only in region elsewhere")

	// A live node of the region has it, but offers no tier 2.
	y := store.NodeInfo{ID: "node_y", Addr: "127.0.0.1:0", Region: "local", Zone: "local-y", Tiers: []int{1, 3},
		VCPU: 1000, MemoryMiB: 1_000_000, Images: []string{"rootfs-1.ext4/uuid-a"}}
	beat(x)
	beat(y)
	refused("image in the region only on a node without tier 2")

	// One of the region with tier 2 has it: the create is admitted.
	z := store.NodeInfo{ID: "node_z", Addr: "127.0.0.1:0", Region: "local", Zone: "local-z", Tiers: []int{2},
		VCPU: 1000, MemoryMiB: 1_000_000, Images: []string{"rootfs-1.ext4/uuid-a"}}
	beat(z)
	e.create(e.key, map[string]any{"tier": 2, "restore_from": mem.ID})
}
