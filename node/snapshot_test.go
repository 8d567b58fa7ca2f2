package node_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/node"
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
	info, err := n.Snapshot(ctx, s, snapID, true)
	if err != nil || info.Memory != wantMemory || info.SizeBytes <= 0 {
		t.Fatalf("snapshot: memory %v (want %v) size %d err %v", info.Memory, wantMemory, info.SizeBytes, err)
	}
	// A VM's memory snapshot names the root disk image its restore needs, and the node's
	// heartbeat advertises it (the placer places the restore by it); runsc's needs none.
	if (info.RootImage != "") != (rt == "cloudhv") {
		t.Fatalf("the memory snapshot names root image %q", info.RootImage)
	}
	if info.RootImage != "" {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			ns, err := st.Nodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(ns, func(x store.NodeInfo) bool { return x.ID == n.Info.ID })
			if i >= 0 && slices.Contains(ns[i].Images, info.RootImage) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the node's heartbeat does not advertise the snapshot's image %s", info.RootImage)
			}
		}
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

// heldRestore is a driver whose restores wait for release (closed by the test) and then
// fail with fail, if set; restoring is closed as the first restore begins.
type heldRestore struct {
	testDriver
	restoring, release chan struct{}
	fail               error
}

func (d heldRestore) Restore(ctx context.Context, s hypervisor.Spec, dir string) error {
	select {
	case <-d.restoring:
	default:
		close(d.restoring)
	}
	select {
	case <-d.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	if d.fail != nil {
		return d.fail
	}
	return d.testDriver.Restore(ctx, s, dir)
}

// startHeldRestores starts node nodeID on runtime rt, its driver's restores held as
// heldRestore holds them (failing with fail; let go at once unless held), and provisions a
// session of project on it.
func startHeldRestores(t *testing.T, rt, project, nodeID string, fail error, held bool) (*store.Store, heldRestore, node.Config, *running, *session.Session) {
	t.Helper()
	st, _ := newStore(t)
	inner := newDriver(t, rt, tempDir(t))
	d := heldRestore{testDriver: inner, restoring: make(chan struct{}), release: make(chan struct{}), fail: fail}
	if !held {
		close(d.release)
	}
	cfg := nodeConfig(t, st, inner, tempDir(t), nodeID)
	cfg.Driver = d
	n := startNode(t, cfg)
	return st, d, cfg, n, provision(t, st, n.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
}

// TestMemorySnapshotAnsweredBeforeTheRestore: a memory snapshot is answered once its
// checkpoint is written, while the guest it stopped is still being restored (on runsc the
// restore was more than half of the snapshot's time); an exec meanwhile waits for the guest
// and finds it as it was.
func TestMemorySnapshotAnsweredBeforeTheRestore(t *testing.T) {
	t.Parallel()
	const project = "proj_snapearly"
	_, d, cfg, n, s := startHeldRestores(t, "runsc", project, "node_snapearly", nil, true)
	ctx := ctxT(t, 5*time.Minute)
	if res, err := execIn(ctx, n.Node, s, "echo kept > /workspace/f"); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	released := false
	defer func() {
		if !released {
			close(d.release)
		}
	}()
	snapID := session.NewID("snap_", time.Now())
	answered := make(chan error, 1)
	go func() {
		info, err := n.Snapshot(ctx, s, snapID, true)
		mem := info.Memory
		if err == nil && !mem {
			err = errors.New("the snapshot holds no memory")
		}
		answered <- err
	}()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the snapshot was not answered while its guest's restore waited")
	}
	select {
	case <-d.restoring:
	case <-time.After(2 * time.Minute):
		t.Fatal("no restore began after the snapshot")
	}
	// Deleted at once, the snapshot's files stay until the restore has read them.
	snapDir := filepath.Join(cfg.DataDir, "snapshots", snapID)
	if err := n.DeleteSnapshot(ctx, snapID); err != nil {
		t.Fatalf("delete the snapshot while its guest is restored: %v", err)
	}
	if _, err := os.Stat(snapDir); err != nil {
		t.Fatalf("the snapshot's files went while the restore needed them: %v", err)
	}
	type result struct {
		res session.ExecResult
		err error
	}
	ran := make(chan result, 1)
	go func() {
		res, err := execIn(ctx, n.Node, s, "cat /workspace/f")
		ran <- result{res, err}
	}()
	select {
	case r := <-ran:
		t.Fatalf("an exec ran while the guest was still being restored: %+v, %v", r.res, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	close(d.release)
	released = true
	if r := <-ran; r.err != nil || r.res.Stdout != "kept\n" {
		t.Fatalf("the exec that waited for the restore: %+v, %v", r.res, r.err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(snapDir); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the deleted snapshot's files stayed after the restore")
		}
	}
}

// TestRestoreFailsAfterTheSnapshot: when the guest cannot be restored after its memory
// snapshot was answered, the session fails with guest_crash, even though the node's failure
// comes while the snapshot's caller has yet to return the session to running.
func TestRestoreFailsAfterTheSnapshot(t *testing.T) {
	t.Parallel()
	const project = "proj_snaplost"
	st, d, _, n, s := startHeldRestores(t, "runsc", project, "node_snaplost", errors.New("a restore that fails"), false)
	ctx := ctxT(t, 5*time.Minute)
	// As the gateway does around the node's snapshot.
	cur, err := st.Transition(ctx, store.Change{Project: project, ID: s.ID, From: session.Running, To: session.Snapshotting, Driver: session.Caller})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Snapshot(ctx, cur, session.NewID("snap_", time.Now()), true); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	<-d.restoring
	time.Sleep(time.Second) // the node's failure meets the session still snapshotting
	if _, err := st.Transition(ctx, store.Change{Project: project, ID: s.ID, From: session.Snapshotting, To: session.Running, Driver: session.Caller}); err != nil {
		t.Fatal(err)
	}
	got, _ := waitState(t, st, project, s.ID, time.Minute, session.Failed)
	if got.StateReason == nil || *got.StateReason != session.GuestCrash {
		t.Fatalf("the session whose guest was lost after its snapshot: %s, reason %s", got.State, reasonOf(got))
	}
}

// TestStopSaving: a session stopped saving its guest (a desktop's sleep) is checkpointed,
// memory and all, and ends stopped, its guest gone, without the restore a memory snapshot of
// a running session makes; a session restored from the snapshot has the guest's file. On
// runc, which keeps no memory, nothing is saved, and the session ends all the same.
func TestStopSaving(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{"runsc", "runc"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			testStopSaving(t, rt)
		})
	}
}

func testStopSaving(t *testing.T, rt string) {
	project := "proj_stopsave_" + rt
	st, d, cfg, n, s := startHeldRestores(t, rt, project, "node_stopsave_"+rt, nil, false)
	ctx := ctxT(t, 5*time.Minute)
	if res, err := execIn(ctx, n.Node, s, "echo kept > /workspace/f"); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	// As the gateway does: the session to stopping, then the node's stop, saving it.
	cur, err := st.Transition(ctx, store.Change{Project: project, ID: s.ID, From: session.Running, To: session.Stopping,
		Driver: session.Caller, Reason: session.Deleted})
	if err != nil {
		t.Fatal(err)
	}
	snapID := session.NewID("snap_", time.Now())
	info, err := n.StopSaving(ctx, cur, snapID)
	if want := rt == "runsc"; err != nil || info.Memory != want || (info.SizeBytes > 0) != want {
		t.Fatalf("stop saving: memory %v size %d err %v; want memory %v", info.Memory, info.SizeBytes, err, want)
	}
	if got, _ := waitState(t, st, project, s.ID, time.Minute, session.Stopped); got.StateReason == nil || *got.StateReason != session.Deleted {
		t.Fatalf("stopped saving for %s, want deleted", reasonOf(got))
	}
	select {
	case <-d.restoring:
		t.Fatal("the stop restored the guest it had saved")
	default:
	}
	snapDir := filepath.Join(cfg.DataDir, "snapshots", snapID)
	if !info.Memory {
		if _, err := os.Stat(snapDir); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a stop that saved nothing left %s: %v", snapDir, err)
		}
		return
	}
	restored := restoredSession(t, st, project, n.Info.ID, snapID)
	if err := n.Provision(ctxT(t, 3*time.Minute), n.Info, restored); err != nil {
		t.Fatalf("provision from the saved guest: %v", err)
	}
	if res, err := execIn(ctx, n.Node, restored, "cat /workspace/f"); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("the restored session's /workspace/f: %+v, %v", res, err)
	}
}

// heldCheckpoint is a driver whose memory snapshots wait for release (closed by the test)
// and then fail with fail; checkpointing is closed as the first begins.
type heldCheckpoint struct {
	testDriver
	checkpointing, release chan struct{}
	fail                   error
}

func (d heldCheckpoint) Snapshot(ctx context.Context, id, dir string, memory bool) (hypervisor.SnapshotInfo, error) {
	if !memory {
		return d.testDriver.Snapshot(ctx, id, dir, memory)
	}
	close(d.checkpointing)
	<-d.release
	return hypervisor.SnapshotInfo{}, d.fail
}

// TestStopSavingSurvivesTheNode: a node that winds down while it stops a session saving its
// guest (the checkpoint failed and left the guest running, and a node winding down starts no
// teardown) finds the guest stopping when it starts again, and finishes the stop. Before, the
// restarted node kept the guest, and the session stayed stopping for ever.
func TestStopSavingSurvivesTheNode(t *testing.T) {
	t.Parallel()
	const project, nodeID = "proj_stopsave_restart", "node_stopsave_restart"
	st, _ := newStore(t)
	base, dataDir := tempDir(t), tempDir(t)
	inner := newDriver(t, "runsc", base)
	d := heldCheckpoint{testDriver: inner, checkpointing: make(chan struct{}), release: make(chan struct{}),
		fail: errors.New("a checkpoint that fails")}
	cfg := nodeConfig(t, st, inner, dataDir, nodeID)
	cfg.Driver = d
	a := startNode(t, cfg)
	s := provision(t, st, a.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
	ctx := ctxT(t, 5*time.Minute)
	cur, err := st.Transition(ctx, store.Change{Project: project, ID: s.ID, From: session.Running, To: session.Stopping,
		Driver: session.Caller, Reason: session.Deleted})
	if err != nil {
		t.Fatal(err)
	}
	saved := make(chan error, 1)
	go func() {
		_, err := a.StopSaving(ctx, cur, session.NewID("snap_", time.Now()))
		saved <- err
	}()
	<-d.checkpointing
	// The node winds down meanwhile: at once (Run's loop waits on nothing), so that it starts
	// no teardown once the checkpoint fails; its loops then wait for the guest's lock, which
	// the stop holds until the checkpoint ends.
	a.cancel()
	time.Sleep(2 * time.Second)
	close(d.release)
	if err := <-saved; err == nil {
		t.Fatal("a stop whose checkpoint failed answered that it saved the guest")
	}
	<-a.done
	if info, err := inner.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("the guest before the restart: %+v, %v; want it running (the test's premise)", info, err)
	}
	d2 := openDriver(t, "runsc", base, strings.TrimSuffix(inner.CgroupPath(""), "/"))
	startNode(t, nodeConfig(t, st, d2, dataDir, nodeID))
	if got, _ := waitState(t, st, project, s.ID, 2*time.Minute, session.Stopped); got.StateReason == nil || *got.StateReason != session.Deleted {
		t.Fatalf("after the restart the session ended for %s, want deleted", reasonOf(got))
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := d2.Info(ctx, s.ID); errors.Is(err, hypervisor.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted node left the stopped session's guest")
		}
	}
}
