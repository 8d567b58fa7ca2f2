package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"wb/session"
	"wb/store"
)

// TestRestoreMemorySnapshotImage: a memory snapshot records the root disk image its node
// answers, and its restore goes to a node that has that image (node_fake), though the placer
// would otherwise pick another (node_b, with far more free memory, and another build of the
// image); a disk snapshot's restore goes where any session would. With no live node having
// the image, the create is refused at once with a 400 on restore_from that says so, rather than answered with
// a session that fails on the node (start_failure) or waits out its provisioning deadline.
func TestRestoreMemorySnapshotImage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if err := e.node.SetImages(ctx, "rootfs-1.ext4/uuid-a"); err != nil {
		t.Fatal(err)
	}
	s := e.running(map[string]any{"tier": 2})
	var mem, disk session.Snapshot
	e.mustDo("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, map[string]any{"include_memory": true}, 201, &mem)
	if !mem.IncludeMemory {
		t.Fatalf("snapshot %+v: want memory", mem)
	}
	e.waitState(e.key, s.ID, session.Running)
	e.mustDo("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, map[string]any{"include_memory": false}, 201, &disk)
	e.waitState(e.key, s.ID, session.Running)
	// The API shows no image (do validates the answer against openapi.json).
	e.mustDo("GET", "/v1/snapshots/"+mem.ID, e.key, nil, 200, nil)

	// node_b: preferred by the placer (more free memory), with another build of the image.
	b := store.NodeInfo{ID: "node_b", Addr: "127.0.0.1:0", Region: "local", Zone: "local-b", Tiers: []int{1, 2, 3, 4},
		VCPU: 1000, MemoryMiB: 2_000_000_000, Images: []string{"rootfs-1.ext4/uuid-b"}}
	beat := func() {
		if err := e.st.Heartbeat(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			select {
			case <-hctx.Done():
				return
			case <-time.After(time.Second):
				_ = e.st.Heartbeat(hctx, b)
			}
		}
	}()
	nodeOf := func(id string) string {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			got, err := e.st.Get(ctx, e.projA, id)
			if err != nil {
				t.Fatal(err)
			}
			if got.NodeID != "" || time.Now().After(deadline) {
				return got.NodeID
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if got := nodeOf(e.create(e.key, map[string]any{"tier": 2}).ID); got != "node_b" {
		t.Fatalf("a fresh session went to %q; the test wants node_b preferred", got)
	}
	if got := nodeOf(e.create(e.key, map[string]any{"tier": 2, "restore_from": mem.ID}).ID); got != "node_fake" {
		t.Errorf("the memory snapshot's restore went to %q, want node_fake (the one with its image)", got)
	}
	if got := nodeOf(e.create(e.key, map[string]any{"tier": 2, "restore_from": disk.ID}).ID); got != "node_b" {
		t.Errorf("the disk snapshot's restore went to %q, want node_b (any node)", got)
	}

	// The node with the image leaves the fleet (drained, as no live node at all).
	if err := e.st.SetNodeDraining(ctx, "node_fake", true); err != nil {
		t.Fatal(err)
	}
	// The operator sees each node's images (GET /v1/admin/nodes, validated against openapi.json).
	var nodes struct{ Data []Node }
	e.mustDo("GET", "/v1/admin/nodes", adminKey, nil, 200, &nodes)
	for _, n := range nodes.Data {
		if want := map[string]string{"node_fake": "rootfs-1.ext4/uuid-a", "node_b": "rootfs-1.ext4/uuid-b"}[n.ID]; len(n.Images) != 1 || n.Images[0] != want {
			t.Errorf("node %s shows images %q, want [%s]", n.ID, n.Images, want)
		}
	}
	msg := expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "restore_from": mem.ID}), 400, "invalid_request", "restore_from")
	if !strings.Contains(msg, mem.ID) || !strings.Contains(msg, "no live node has that image") {
		t.Errorf("refusal: %s", msg)
	}
	t.Logf("refused: %s", msg)
	// A disk snapshot is restored on any node all the same.
	if got := nodeOf(e.create(e.key, map[string]any{"tier": 2, "restore_from": disk.ID}).ID); got != "node_b" {
		t.Errorf("the disk snapshot's restore went to %q, want node_b", got)
	}
}
