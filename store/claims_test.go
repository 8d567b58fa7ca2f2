package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
)

// TestClaimOnNode: a claim is made only if it fits in the free room with the node's live
// claims; claims older than the window stop counting; a released claim frees its room; a
// session's own claim made again is not counted twice.
func TestClaimOnNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	now := time.UnixMilli(1_800_000_000_000)
	const window = 10 * time.Second
	claim := func(sess string, vcpu, mem int, at time.Time) bool {
		t.Helper()
		_, ok, err := s.ClaimOnNode(ctx, ClaimAsk{Node: NodeInfo{ID: "n1", VCPU: 4, MemoryMiB: 4096}, Session: sess, VCPU: vcpu, MemoryMiB: mem}, at, window)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !claim("s1", 2, 1024, now) || !claim("s2", 2, 1024, now.Add(time.Second)) {
		t.Fatal("claims within the free room refused")
	}
	if claim("s3", 1, 256, now.Add(2*time.Second)) {
		t.Fatal("a claim past the free vCPUs made")
	}
	if !claim("s2", 2, 1024, now.Add(2*time.Second)) {
		t.Fatal("a session's own claim made again counted against itself")
	}
	got, err := nodeClaims(ctx, s, []string{"n1", "n2"}, now.Add(2*time.Second), window)
	if err != nil || got["n1"] != (NodeUse{VCPU: 4, MemoryMiB: 2048}) || len(got) != 1 {
		t.Fatalf("claims read %v, %v; want n1 4 vCPU 2048 MiB", got, err)
	}
	// Memory refuses as vCPUs do (on another node, whose claims are apart).
	if _, ok, _ := s.ClaimOnNode(ctx, ClaimAsk{Node: NodeInfo{ID: "n2", VCPU: 4, MemoryMiB: 4096}, Session: "s4", VCPU: 1, MemoryMiB: 5000}, now, window); ok {
		t.Fatal("a claim past the free memory made")
	}
	// s1's claim lapses with its window: its room is free again.
	later := now.Add(window)
	if !claim("s3", 2, 256, later) {
		t.Fatal("a lapsed claim still counted")
	}
	if got, _ := nodeClaims(ctx, s, []string{"n1"}, later, window); got["n1"] != (NodeUse{VCPU: 4, MemoryMiB: 1280}) {
		t.Fatalf("claims read %v after s1 lapsed; want 4 vCPU 1280 MiB", got)
	}
	// A release frees its room at once.
	if claim("s5", 2, 256, later) {
		t.Fatal("a claim past the free vCPUs made")
	}
	if err := s.ReleaseOnNode(ctx, "n1", Claim{Session: "s3", VCPU: 2, MemoryMiB: 256}); err != nil {
		t.Fatal(err)
	}
	if !claim("s5", 2, 256, later) {
		t.Fatal("a released claim still counted")
	}
	// The key expires with its newest claim's window.
	if ttl := s.rdb.PTTL(ctx, nodeClaimsKey("n1")).Val(); ttl <= 0 || ttl > window {
		t.Fatalf("claims key TTL %v, want within %v", ttl, window)
	}
	// Several at once (a node's heartbeat showing its sessions), and none.
	if err := s.ReleaseOnNode(ctx, "n1", Claim{Session: "s5", VCPU: 2, MemoryMiB: 256}, Claim{Session: "s2", VCPU: 2, MemoryMiB: 1024}); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseOnNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := nodeClaims(ctx, s, []string{"n1"}, later, window); got["n1"] != (NodeUse{}) {
		t.Fatalf("claims read %v after every claim was released; want none", got)
	}
}

// TestClaimOnNodeConcurrent: many claimers at once never claim more than the room.
func TestClaimOnNodeConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	now := time.Now()
	var made atomic.Int32
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			_, ok, err := s.ClaimOnNode(ctx, ClaimAsk{Node: NodeInfo{ID: "n1", VCPU: 8, MemoryMiB: 1 << 20}, Session: fmt.Sprintf("s%d", i), VCPU: 1, MemoryMiB: 100}, now, time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ok {
				made.Add(1)
			}
		})
	}
	wg.Wait()
	if made.Load() != 8 {
		t.Fatalf("%d claims of 1 vCPU made on 8 free vCPUs, want 8", made.Load())
	}
}

// nodeClaims reads the live claims of nodes as ReadPlacement does, in one round trip.
func nodeClaims(ctx context.Context, s *Store, nodes []string, now time.Time, window time.Duration) (map[string]NodeUse, error) {
	cmds := make([]*redis.StringSliceCmd, len(nodes))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, n := range nodes {
			cmds[i] = liveClaims(ctx, p, n, now, window)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return claimsFrom(nodes, cmds), nil
}

// TestClaimOnNodeReadsTheHeartbeat: a claim must fit in the node's room as its latest
// heartbeat reports it when the claim is made, whatever free room the caller read before (a
// placer's read gone stale in a stall, trusted, overbooked the node); the caller's read
// counts only for a node with no room recorded. On every backend: in a cluster the node's
// claims and its room are one slot.
func TestClaimOnNodeReadsTheHeartbeat(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			now := time.Now()
			claim := func(node, sess string, mem int) bool {
				t.Helper()
				// The caller read 4 vCPUs and 4096 MiB free.
				_, ok, err := s.ClaimOnNode(ctx, ClaimAsk{Node: NodeInfo{ID: node, VCPU: 4, MemoryMiB: 4096}, Session: sess, VCPU: 1, MemoryMiB: mem}, now, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			beat := func(usedMem int) {
				t.Helper()
				if err := s.Heartbeat(ctx, NodeInfo{ID: "n1", VCPU: 4, MemoryMiB: 4096, UsedVCPU: 1, UsedMemoryMiB: usedMem}); err != nil {
					t.Fatal(err)
				}
			}
			beat(2048)
			if !claim("n1", "s1", 2048) {
				t.Fatal("a claim within the room the node's heartbeat reports refused")
			}
			if claim("n1", "s2", 2048) {
				t.Fatal("a claim past the room the node's heartbeat reports made (the caller's stale read of 4096 MiB free trusted)")
			}
			beat(0)
			if !claim("n1", "s2", 2048) {
				t.Fatal("a claim within the room a later heartbeat reports refused")
			}
			// A node whose heartbeat recorded no room: the caller's read is all there is.
			if !claim("n2", "s3", 4096) || claim("n2", "s4", 1) {
				t.Fatal("a node with no room recorded not judged by the caller's read")
			}
			if err := s.RemoveNode(ctx, "n1"); err != nil {
				t.Fatal(err)
			}
			if n, err := s.rdb.Exists(ctx, nodeRoomKey("n1")).Result(); err != nil || n != 0 {
				t.Fatalf("a removed node's room left: %d, %v", n, err)
			}
		})
	}
}

// TestReleaseOnNodeKeepsOthersClaims: two placers claiming one session on one node (one
// stalled past its project lock) hold one session's room there; the one whose placement lost
// releases its own claim only, not the winner's, which the node's heartbeat may not show yet;
// the node's release (no token) drops every claim of the session. On every backend.
func TestReleaseOnNodeKeepsOthersClaims(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			now := time.Now()
			const window = time.Minute
			claim := func(sess string, vcpu int) (Claim, bool) {
				t.Helper()
				c, ok, err := s.ClaimOnNode(ctx, ClaimAsk{Node: NodeInfo{ID: "n1", VCPU: 4, MemoryMiB: 1 << 20}, Session: sess, VCPU: vcpu, MemoryMiB: 1024}, now, window)
				if err != nil {
					t.Fatal(err)
				}
				return c, ok
			}
			claimed := func(want NodeUse, why string) {
				t.Helper()
				if got, err := nodeClaims(ctx, s, []string{"n1"}, now, window); err != nil || got["n1"] != want {
					t.Fatalf("claims %v, %v %s; want %+v", got, err, why, want)
				}
			}
			_, wonOK := claim("s1", 2)
			lost, lostOK := claim("s1", 2)
			if !wonOK || !lostOK {
				t.Fatal("a session's second claim counted against its first")
			}
			claimed(NodeUse{VCPU: 2, MemoryMiB: 1024}, "after two claims of s1")
			if _, ok := claim("s2", 2); !ok {
				t.Fatal("s1's two claims held two sessions' room")
			}
			if err := s.ReleaseOnNode(ctx, "n1", lost); err != nil {
				t.Fatal(err)
			}
			claimed(NodeUse{VCPU: 4, MemoryMiB: 2048}, "after the losing claim of s1 was released")
			if _, ok := claim("s3", 1); ok {
				t.Fatal("a claim past the free vCPUs made: the losing release dropped the winner's claim")
			}
			if err := s.ReleaseOnNode(ctx, "n1", Claim{Session: "s1", VCPU: 2, MemoryMiB: 1024}); err != nil {
				t.Fatal(err)
			}
			claimed(NodeUse{VCPU: 2, MemoryMiB: 1024}, "after the node released s1's claims")
		})
	}
}

// TestNodeRoomLapses: a node's room lapses a few heartbeats after the latest that wrote it,
// and each heartbeat renews it; a claim on a node whose room lapsed is judged by the
// caller's read, as before the room was recorded. Before, the room never expired: a node
// rolled back to a wb that writes no room kept its last one for good, and every claim on it
// was judged by that.
func TestNodeRoomLapses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	const every = 100 * time.Millisecond
	beat := func(usedMem int) {
		t.Helper()
		if err := s.Heartbeat(ctx, NodeInfo{ID: "n1", VCPU: 4, MemoryMiB: 4096, UsedVCPU: 4, UsedMemoryMiB: usedMem, HeartbeatEvery: every}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(sess string) bool {
		t.Helper()
		// The caller read 4 vCPUs and 4096 MiB free; the room says none.
		_, ok, err := s.ClaimOnNode(ctx, ClaimAsk{Node: NodeInfo{ID: "n1", VCPU: 4, MemoryMiB: 4096}, Session: sess, VCPU: 1, MemoryMiB: 256}, time.Now(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	beat(4096)
	ttl := s.rdb.PTTL(ctx, nodeRoomKey("n1")).Val()
	if ttl <= 0 || ttl > roomBeats*every {
		t.Fatalf("the node's room has TTL %v; want within %d heartbeats of %v", ttl, roomBeats, every)
	}
	if claim("s1") {
		t.Fatal("a claim past the room the node's heartbeat reports made")
	}
	// Heartbeats renew it: it outlives its first TTL.
	for range roomBeats + 2 {
		time.Sleep(every)
		beat(4096)
	}
	if n := s.rdb.Exists(ctx, nodeRoomKey("n1")).Val(); n != 1 {
		t.Fatal("the room of a node that beats lapsed")
	}
	// The node beats no more (or with a wb that writes no room): its room lapses, and the
	// caller's read decides.
	time.Sleep(roomBeats*every + 100*time.Millisecond)
	if n := s.rdb.Exists(ctx, nodeRoomKey("n1")).Val(); n != 0 {
		t.Fatal("the room of a node that stopped writing it is still there")
	}
	if !claim("s2") {
		t.Fatal("a claim on a node whose room lapsed not judged by the caller's read")
	}
}

// TestClaimOnNodeKeepsTheShare: a project's claim on a node must keep the project within its
// share of the node with what the node's latest heartbeat reports of the project and the
// project's live claims there, whatever the caller read (two placers of one project, one
// stalled past its project lock, each checked the share against its own read, and together
// placed the project past it). A room of an older wb, with no projects, leaves the share to
// the caller. On every backend.
func TestClaimOnNodeKeepsTheShare(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			now := time.Now()
			// The caller read an empty 8-vCPU node; the project may hold half of it.
			claim := func(project, sess string, vcpu int) bool {
				t.Helper()
				_, ok, err := s.ClaimOnNode(ctx, ClaimAsk{Node: NodeInfo{ID: "n1", VCPU: 8, MemoryMiB: 8192}, Session: sess, Project: project,
					VCPU: vcpu, MemoryMiB: 256, SharePct: 50}, now, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			beat := func(projects map[string]NodeUse) {
				t.Helper()
				n := NodeInfo{ID: "n1", VCPU: 8, MemoryMiB: 8192, Projects: projects}
				for _, u := range projects {
					n.UsedVCPU += u.VCPU
					n.UsedMemoryMiB += u.MemoryMiB
				}
				if err := s.Heartbeat(ctx, n); err != nil {
					t.Fatal(err)
				}
			}
			// Another placer's sessions of proj_a, which the node's heartbeat shows, hold 3 of
			// its 4 vCPUs; a project whose name ends another's is apart.
			beat(map[string]NodeUse{"proj_a": {VCPU: 3, MemoryMiB: 512}, "xproj_a": {VCPU: 1, MemoryMiB: 256}})
			if claim("proj_a", "s1", 2) {
				t.Fatal("a claim past the project's share with what the node's heartbeat reports made")
			}
			if !claim("proj_a", "s1", 1) {
				t.Fatal("a claim within the project's share refused")
			}
			// The project's live claims count too, each session's once.
			if !claim("proj_a", "s1", 1) {
				t.Fatal("a session's own claim made again counted against its share")
			}
			if claim("proj_a", "s2", 1) {
				t.Fatal("a claim past the project's share with its live claims made")
			}
			if !claim("proj_b", "s3", 3) {
				t.Fatal("another project's claim refused for proj_a's share")
			}
			// The heartbeat shows s1 (its claim not released yet) and proj_a's others gone.
			beat(map[string]NodeUse{"proj_a": {VCPU: 1, MemoryMiB: 256}})
			if !claim("proj_a", "s4", 2) || claim("proj_a", "s5", 1) {
				t.Fatal("the share not checked against the latest heartbeat and the live claims")
			}
			// A room with no projects (an older wb's node): the caller checked the share.
			if err := s.rdb.HDel(ctx, nodeRoomKey("n1"), "projects").Err(); err != nil {
				t.Fatal(err)
			}
			if !claim("proj_a", "s6", 1) {
				t.Fatal("a node whose room has no projects judged by a share it cannot know")
			}
		})
	}
}
