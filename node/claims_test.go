package node_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/node"
	"wb/session"
	"wb/store"
)

// TestPlacementClaimsEnd: the placement claims the placer makes on a node (store.ClaimOnNode,
// held for a window of twice the heartbeat timeout unless released) end when the node no
// longer needs them: a running session's once a heartbeat after the first that shows it is
// written, an ended session's at once. Left to their window, they held the node's room that
// long after each short session, and a fleet placed no more than its capacity ÷ 14 s sessions
// a second (wb load: 1.75 flows/s on 3 nodes waited seconds in pending, 2/s failed sessions
// with provision_timeout). The claims here are made with an hour's window, so only the node
// can end them.
func TestPlacementClaimsEnd(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	const capacity = 64 // nodeConfig's vCPUs
	claim := func(t *testing.T, nodeID, sessionID string, vcpu int) (store.Claim, bool) {
		t.Helper()
		c, ok, err := st.ClaimOnNode(ctxT(t, 10*time.Second), store.ClaimAsk{Node: store.NodeInfo{ID: nodeID, VCPU: capacity, MemoryMiB: 1 << 20}, Session: sessionID, VCPU: vcpu, MemoryMiB: 256}, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return c, ok
	}
	// fits answers whether vcpu more fit beside the node's live claims and what its latest
	// heartbeat reports in use (the probe's own claim is released at once).
	fits := func(t *testing.T, nodeID string, vcpu int) bool {
		t.Helper()
		c, ok := claim(t, nodeID, "probe", vcpu)
		if ok {
			if err := st.ReleaseOnNode(ctxT(t, 10*time.Second), nodeID, c); err != nil {
				t.Fatal(err)
			}
		}
		return ok
	}
	// start places a session on n with its claim, as the placer does, and starts it.
	start := func(t *testing.T, n *node.Node, project string) *session.Session {
		t.Helper()
		s := placed(t, st, project, n.Info.ID, sessionOpts{idleS: 300, lifeS: 600, res: small()})
		if _, ok := claim(t, n.Info.ID, s.ID, s.Resources.VCPU); !ok {
			t.Fatalf("no room to claim for %s", s.ID)
		}
		if err := n.Provision(ctxT(t, 3*time.Minute), n.Info, s); err != nil {
			t.Fatalf("provision %s: %v", s.ID, err)
		}
		if got, _ := waitState(t, st, project, s.ID, time.Minute, session.Running, session.Failed, session.Stopped); got.State != session.Running {
			t.Fatalf("the session is %s %s, want running", got.State, reasonOf(got))
		}
		return s
	}
	waitFits := func(t *testing.T, nodeID string, vcpu int, why string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !fits(t, nodeID, vcpu); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d vCPUs still do not fit beside the claims 20 s after %s", vcpu, why)
			}
		}
	}

	t.Run("shown by heartbeats", func(t *testing.T) {
		t.Parallel()
		cfg := nodeConfig(t, st, newDriver(t, "runc", tempDir(t)), tempDir(t), "node_claims_hb")
		cfg.Heartbeat = 500 * time.Millisecond
		n := startNode(t, cfg)
		start(t, n.Node, "proj_claims_hb")
		// Once a heartbeat shows the session, the rest of the node fits only without its claim.
		var used int
		for deadline := time.Now().Add(20 * time.Second); used == 0; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no heartbeat showed the running session within 20 s")
			}
			nodes, err := st.Nodes(ctxT(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for _, i := range nodes {
				if i.ID == n.Info.ID {
					used = i.UsedVCPU
				}
			}
		}
		waitFits(t, n.Info.ID, capacity-used, "the session ran, its room in the heartbeats")
		// The heartbeats report what each project holds, for the claims' check of its share:
		// at a share that its session fills, one more vCPU of the project does not fit, and
		// one of another project does.
		pct := (used*100 + capacity - 1) / capacity
		shareFits := func(project string) bool {
			t.Helper()
			c, ok, err := st.ClaimOnNode(ctxT(t, 10*time.Second), store.ClaimAsk{Node: store.NodeInfo{ID: n.Info.ID}, Session: "probe", Project: project,
				VCPU: 1, MemoryMiB: 1, SharePct: pct}, time.Now(), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				if err := st.ReleaseOnNode(ctxT(t, 10*time.Second), n.Info.ID, c); err != nil {
					t.Fatal(err)
				}
			}
			return ok
		}
		if shareFits("proj_claims_hb") || !shareFits("proj_claims_other") {
			t.Fatalf("at a share of %d %% of %d vCPUs, a vCPU more of the project that holds %d fits, or one of another project does not", pct, capacity, used)
		}
	})

	t.Run("ended", func(t *testing.T) {
		t.Parallel()
		cfg := nodeConfig(t, st, newDriver(t, "runc", tempDir(t)), tempDir(t), "node_claims_end")
		cfg.Heartbeat = time.Hour // the first heartbeat only, at the node's start: none shows a session
		n := startNode(t, cfg)
		const project = "proj_claims_end"
		start(t, n.Node, project)
		ended := start(t, n.Node, project)
		if fits(t, n.Info.ID, capacity-1) {
			t.Fatal("the two sessions' claims did not count")
		}
		deleteSession(t, st, n.Node, project, ended.ID)
		waitFits(t, n.Info.ID, capacity-1, "one of the two sessions ended")
		// No heartbeat showed the other, running session: its claim stays.
		if fits(t, n.Info.ID, capacity) {
			t.Fatal("the claim of a running session that no heartbeat showed was released")
		}
	})
}

// TestHeartbeatRetriedAfterAFailure: a heartbeat that failed (Redis away at the node's start)
// is tried again within a second, not a whole interval later: with an interval of an hour,
// the node registers within seconds of Redis coming back.
func TestHeartbeatRetriedAfterAFailure(t *testing.T) {
	t.Parallel()
	r := redistest.StartDurableProc(t)
	st := store.New(redisClient(t, r.Addr()))
	cfg := nodeConfig(t, st, newDriver(t, "runc", tempDir(t)), tempDir(t), "node_hb_retry")
	cfg.Heartbeat = time.Hour
	cfg.RedisTimeout = 200 * time.Millisecond
	r.Stop()
	runNode(t, cfg)
	ctx := context.Background()
	time.Sleep(time.Second) // the first heartbeat has failed
	r.Start()
	back := time.Now()
	for {
		nodes, err := st.Nodes(ctx)
		if err == nil && slices.ContainsFunc(nodes, func(i store.NodeInfo) bool { return i.ID == cfg.Info.ID }) {
			t.Logf("registered %s after Redis came back", time.Since(back).Round(time.Millisecond))
			return
		}
		if time.Since(back) > 30*time.Second {
			t.Fatalf("the node did not register within 30 s of Redis coming back (its interval: an hour): %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
