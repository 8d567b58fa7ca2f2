package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"wb/desktop"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// TestDesktopWakeNeedsImage: a desktop's sleep records the root disk image its saved state
// needs, as a session's memory snapshot does, so that its wake is placed on a node that has
// that image (node_fake), though the placer would otherwise pick another (node_b, with far
// more free memory and another build of the image). With no live node having the image, the
// wake is from the disk, and the desktop's message says why.
func TestDesktopWakeNeedsImage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const img = "rootfs-1.ext4/uuid-a"
	if err := e.node.SetImages(ctx, img); err != nil {
		t.Fatal(err)
	}
	d := e.newDesktop(map[string]any{"name": "d"})
	if got := e.nodeOf(d.SessionID); got != "node_fake" {
		t.Fatalf("the desktop's first session is on %q, want node_fake (the only node yet)", got)
	}
	sleep := func() desktop.Record {
		t.Helper()
		e.desktopAction(d.ID, "sleep", 202)
		e.waitDesktop(d.ID, desktop.Asleep)
		rec, err := e.st.GetDesktop(ctx, e.projA, d.ID)
		if err != nil || rec.MemorySnapshot == "" {
			t.Fatalf("asleep %+v %v", rec, err)
		}
		var snap session.SnapshotRecord
		if err := e.st.GetObject(ctx, e.projA, store.KindSnapshot, rec.MemorySnapshot, &snap); err != nil {
			t.Fatal(err)
		}
		if !snap.IncludeMemory || snap.RootImage != img {
			t.Errorf("the sleep's snapshot records %+v; want memory and the root image %q", snap, img)
		}
		return rec
	}
	rec := sleep()

	// node_b: preferred by the placer (more free memory), with another build of the image.
	e.beatNode(store.NodeInfo{ID: "node_b", Addr: "127.0.0.1:0", Region: "local", Zone: "local-b", Tiers: []int{1, 2, 3, 4},
		VCPU: 1000, MemoryMiB: 1 << 31, Images: []string{"rootfs-1.ext4/uuid-b"}})
	if got := e.nodeOf(e.create(e.key, map[string]any{"tier": 2}).ID); got != "node_b" {
		t.Fatalf("a fresh session went to %q; the test wants node_b preferred", got)
	}

	e.desktopAction(d.ID, "wake", 202)
	d = e.waitDesktop(d.ID, desktop.Running)
	s := e.sessionOf(d.SessionID)
	if got := e.nodeOf(s.ID); got != "node_fake" || s.RestoreFrom == nil || *s.RestoreFrom != rec.MemorySnapshot {
		from := "nothing"
		if s.RestoreFrom != nil {
			from = *s.RestoreFrom
		}
		t.Fatalf("woke on %q from %s (%q); want node_fake (the one with the image) from the saved state %s",
			got, from, d.Message, rec.MemorySnapshot)
	}

	// Asleep again, and the node with the image leaves the fleet (drained, as no live node at
	// all): the wake is from the disk, on node_b, saying why.
	rec = sleep()
	if err := e.st.SetNodeDraining(ctx, "node_fake", true); err != nil {
		t.Fatal(err)
	}
	e.desktopAction(d.ID, "wake", 202)
	d = e.waitDesktop(d.ID, desktop.Running)
	s = e.sessionOf(d.SessionID)
	if s.RestoreFrom == nil || *s.RestoreFrom != rec.DiskSnapshot {
		t.Fatalf("woke from %v (%q); want the disk %s", s.RestoreFrom, d.Message, rec.DiskSnapshot)
	}
	if !strings.HasPrefix(d.Message, "state not saved") || !strings.Contains(d.Message, "no live node has that image") {
		t.Errorf("woke from the disk saying %q; want why (no live node has the image)", d.Message)
	}
	if got := e.nodeOf(s.ID); got != "node_b" {
		t.Errorf("woke from the disk on %q, want node_b", got)
	}
	if e.snapshotExists(rec.MemorySnapshot) {
		t.Errorf("the saved state %s no node can restore was kept", rec.MemorySnapshot)
	}
}

// nodeOf waits for session id to be placed (two minutes at most) and answers its node, ""
// when it was not.
func (e *env) nodeOf(id string) string {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := e.st.Get(context.Background(), e.projA, id)
		if err != nil {
			e.t.Fatal(err)
		}
		if got.NodeID != "" || time.Now().After(deadline) {
			return got.NodeID
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// beatNode registers node n and heartbeats it every second until the test ends.
func (e *env) beatNode(n store.NodeInfo) {
	e.t.Helper()
	e.beatWith(e.st, n)
}

// beatWith heartbeats n through st now and every second until the test ends.
func (e *env) beatWith(st *store.Store, n store.NodeInfo) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := st.Heartbeat(ctx, n); err != nil {
		cancel()
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	e.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				_ = st.Heartbeat(ctx, n)
			}
		}
	}()
}

// asleepWithImageElsewhere answers a desktop put to sleep on node_fake, which has the image
// "rootfs-1.ext4/uuid-a" its saved state records, and its record; a second node, node_b, with
// room and another image, beats beside it.
func (e *env) asleepWithImageElsewhere() (desktop.Desktop, desktop.Record) {
	e.t.Helper()
	ctx := context.Background()
	if err := e.node.SetImages(ctx, "rootfs-1.ext4/uuid-a"); err != nil {
		e.t.Fatal(err)
	}
	d := e.newDesktop(map[string]any{"name": "d"})
	e.desktopAction(d.ID, "sleep", 202)
	e.waitDesktop(d.ID, desktop.Asleep)
	rec, err := e.st.GetDesktop(ctx, e.projA, d.ID)
	if err != nil || rec.MemorySnapshot == "" {
		e.t.Fatalf("asleep %+v %v", rec, err)
	}
	e.beatNode(store.NodeInfo{ID: "node_b", Addr: "127.0.0.1:0", Region: "local", Zone: "local-b", Tiers: []int{1, 2, 3, 4},
		VCPU: 1000, MemoryMiB: 1 << 31, Images: []string{"rootfs-1.ext4/uuid-b"}})
	return d, rec
}

// TestDesktopWakeNoRoomWithImage: a wake whose saved state only a full node can restore (the
// one with its root disk image) is refused with a 409 no_capacity, the desktop left asleep
// with its state, as when no machine has room (seed 001), though another node without the
// image has room: the wake would wait pending for the full node until its provisioning
// deadline, and then lose the state. Once the node has room, the wake restores it there.
func TestDesktopWakeNoRoomWithImage(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d, rec := e.asleepWithImageElsewhere()
	if err := e.node.SetCapacity(ctx, 0); err != nil { // node_fake, the one with the image, is full
		t.Fatal(err)
	}
	msg := expectError(t, e.do("POST", "/v1/desktops/"+d.ID+":wake", e.key, nil), 409, "no_capacity", "")
	t.Logf("refused: %s", msg)
	// Resizing an asleep desktop gives its saved state up (seed 001): advice to resize must say so.
	if strings.Contains(msg, "resize") && !strings.Contains(msg, "gives the saved state up") {
		t.Errorf("the refusal %q advises a resize without saying it gives the saved state up", msg)
	}
	if got := e.desktop(d.ID); got.State != desktop.Asleep || !got.StateSaved || e.memorySnapshotOf(d.ID) != rec.MemorySnapshot {
		t.Fatalf("after the refused wake: %+v; want it asleep with its state %s", got, rec.MemorySnapshot)
	}

	if err := e.node.SetCapacity(ctx, 1000); err != nil {
		t.Fatal(err)
	}
	e.desktopAction(d.ID, "wake", 202)
	d = e.waitDesktop(d.ID, desktop.Running)
	if s := e.sessionOf(d.SessionID); s.RestoreFrom == nil || *s.RestoreFrom != rec.MemorySnapshot || e.nodeOf(s.ID) != "node_fake" {
		t.Fatalf("woke from %v on %q; want the saved state %s on node_fake", s.RestoreFrom, e.nodeOf(s.ID), rec.MemorySnapshot)
	}
}

// TestDesktopWakeUnplacedKeepsState: a wake accepted by the room check (desktopRoom: the node
// with the saved state's image has room by its heartbeat) that the placer still cannot place
// there (here the project's share of that node, 50% by default, which the room check does not
// count; a placement that took the room meanwhile does the same) fails at its provisioning
// deadline without its saved state ever being tried. The desktop then goes back to sleep with
// its state, saying why, as when no machine has room (seed 001): it does not give the state up
// and wake from its disk on another node.
func TestDesktopWakeUnplacedKeepsState(t *testing.T) {
	tiers := patientTiers()
	tiers[DesktopTier-1].ColdP95 = 5 * time.Second // the wake's session fails 15 s after it is made
	e := newEnvTiers(t, redistest.Server(t), tiers)
	ctx := context.Background()
	d, rec := e.asleepWithImageElsewhere()
	// node_fake, the one with the image, has just the desktop's vCPUs: room by its heartbeat,
	// but more than the project's share of it.
	if err := e.node.SetCapacity(ctx, desktop.Size(d.Size).Resources().VCPU); err != nil {
		t.Fatal(err)
	}
	e.desktopAction(d.ID, "wake", 202)
	var got desktop.Desktop
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got = e.desktop(d.ID)
		if got.State != desktop.Starting || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got.State != desktop.Asleep || !got.StateSaved || e.memorySnapshotOf(d.ID) != rec.MemorySnapshot || !e.snapshotExists(rec.MemorySnapshot) {
		t.Fatalf("after a wake no node could place: %s (stateSaved %v, %q), saved state %q; want it asleep with its state %s",
			got.State, got.StateSaved, got.Message, e.memorySnapshotOf(d.ID), rec.MemorySnapshot)
	}
	if !strings.Contains(got.Message, "room") {
		t.Errorf("asleep again saying %q; want why (no machine that can restore its state had room)", got.Message)
	}
}
