package node_test

import (
	"testing"
	"time"

	"wb/hypervisor"
	"wb/session"
	"wb/store"
)

// TestSnapshotRestore runs a session's lifecycle on each back end (cloudhv over the fake
// VMM): provision, exec, pause, resume, a snapshot asked with memory, which holds memory
// where the back end can save it (CH's vm.snapshot; runc cannot), an exec
// in the session it goes on in, and a new session restored from it holding the file.
func TestSnapshotRestore(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{"runsc", "runc", "cloudhv"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			testSnapshotRestore(t, rt, rt != "runc")
		})
	}
}

func testSnapshotRestore(t *testing.T, rt string, wantMemory bool) {
	const project = "proj_snap"
	st, _ := newStore(t)
	d := newDriver(t, rt, tempDir(t))
	n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_snap"))
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
	ctx := ctxT(t, 5*time.Minute)
	if res, err := execIn(ctx, n.Node, s, "echo kept > /workspace/f && cat /workspace/f"); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	if err := n.Pause(ctx, s); err != nil {
		t.Fatal(err)
	}
	if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StatePaused {
		t.Fatalf("after the node's pause: %+v, %v", info, err)
	}
	if err := n.Resume(ctx, s); err != nil {
		t.Fatal(err)
	}
	if res, err := execIn(ctx, n.Node, s, "cat /workspace/f"); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("exec after resume: %+v, %v", res, err)
	}
	snapID := session.NewID("snap_", time.Now())
	if mem, size, err := n.Snapshot(ctx, s, snapID, true); err != nil || mem != wantMemory || size <= 0 {
		t.Fatalf("snapshot: memory %v (want %v) size %d err %v", mem, wantMemory, size, err)
	}
	if res, err := execIn(ctx, n.Node, s, "cat /workspace/f && echo after > /workspace/g"); err != nil || res.ExitCode != 0 || res.Stdout != "kept\n" {
		t.Fatalf("exec after the snapshot: %+v, %v", res, err)
	}

	restored := restoredSession(t, st, project, n.Info.ID, snapID)
	t0 := time.Now()
	if err := n.Provision(ctxT(t, 3*time.Minute), n.Info, restored); err != nil {
		t.Fatalf("provision from the snapshot: %v", err)
	}
	// The snapshot's agent was quiesced for the checkpoint, for at most a minute
	// (quiesceMost) unless the node ends it: a restore that waits the minute out is a bug
	// (it failed every restore whose provisioning deadline was shorter), not load. A VM's
	// agent is never quiesced, and its restore may queue behind the test binary's other
	// cloudhv guests (chvStarts): 71 s in one CI run.
	if took := time.Since(t0); rt != "cloudhv" && took > 30*time.Second {
		t.Errorf("the restored session took %v to provision: its agent waited out the quiesce", took)
	}
	if res, err := execIn(ctx, n.Node, restored, "cat /workspace/f; ls /workspace"); err != nil || res.Stdout != "kept\nf\n" {
		t.Fatalf("the restored session's /workspace: %+v, %v", res, err)
	}
}

// restoredSession writes a session placed on nodeID that restores snapID.
func restoredSession(t testing.TB, st *store.Store, project, nodeID, snapID string) *session.Session {
	t.Helper()
	tpl := catalog["tpl_base"]
	now := time.Now()
	s := &session.Session{ID: session.NewID("sess_", now), Tier: 2, State: session.Pending, ProjectID: project,
		Template: tpl.Name + "@" + tpl.Digest, Region: "local", CreatedAt: *session.At(now), IdleTimeoutS: 600, MaxLifetimeS: 1200,
		Resources: small(), RestoreFrom: &snapID}
	ctx := ctxT(t, 10*time.Second)
	if _, err := st.Create(ctx, s, 10); err != nil {
		t.Fatal(err)
	}
	out, err := st.Transition(ctx, store.Change{Project: project, ID: s.ID, From: session.Pending,
		To: session.Provisioning, Driver: session.Placer, Zone: "local-a", NodeID: nodeID})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
