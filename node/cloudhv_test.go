package node_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
	"wb/session"
	"wb/store"
)

// fakeCH is the fake Cloud Hypervisor's command (chvtest/fakech), built once per test binary.
var fakeCH struct {
	once sync.Once
	path string
	err  error
}

// newCloudHVDriver returns a cloudhv driver over the fake VMM with its own state dir and
// cgroup parent under base, whose guests are all deleted when the test ends.
func newCloudHVDriver(t testing.TB, base string) *cloudhv.Driver {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the node tests need root")
	}
	fakeCH.once.Do(func() {
		dir, err := os.MkdirTemp("", "wbn-fakech-")
		if err != nil {
			fakeCH.err = err
			return
		}
		_ = os.Chmod(dir, 0o755)
		fakeCH.path = filepath.Join(dir, "fakech")
		out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", fakeCH.path, "wb/hypervisor/cloudhv/chvtest/fakech").CombinedOutput()
		if err != nil {
			fakeCH.err = err
			fakeCH.path = string(out)
		}
	})
	if fakeCH.err != nil {
		t.Fatalf("build fakech: %v\n%s", fakeCH.err, fakeCH.path)
	}
	d := openCloudHVDriver(t, base, "/wbnodetest-ch-"+randHex(t, 4))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ids, _ := d.List(ctx)
		for _, id := range ids {
			if err := d.Delete(ctx, id); err != nil {
				t.Logf("cleanup: delete %s: %v", id, err)
			}
		}
		_ = d.RemoveCgroupParent()
	})
	return d
}

// openCloudHVDriver is a cloudhv driver on base's state dir (a restarted node opens a second).
func openCloudHVDriver(t testing.TB, base, cgroupParent string) *cloudhv.Driver {
	t.Helper()
	kernel := filepath.Join(base, "vmlinuz")
	if err := os.WriteFile(kernel, []byte("the fake VMM loads no kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := cloudhv.New(context.Background(), cloudhv.Options{Binary: fakeCH.path, Kernel: kernel,
		StateDir: filepath.Join(base, "ch"), CacheDir: filepath.Join(base, "chcache"),
		CgroupParent: cgroupParent, Logger: testLogger(t)}) // the fake checks every request and answer against the API document
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestCloudHVNodeRestart: a node that stops leaves its VM running; a new node (and driver)
// on the same dirs recovers it, reaches its agent, and fails the session with guest_crash
// when its VMM dies.
func TestCloudHVNodeRestart(t *testing.T) {
	t.Parallel()
	const project = "proj_chv_restart"
	st, _ := newStore(t)
	base, dataDir := tempDir(t), tempDir(t)
	d := newCloudHVDriver(t, base)
	cfg := nodeConfig(t, st, nil, dataDir, "node_chv_restart")
	cfg.Driver = d
	a := startNode(t, cfg)
	s := provision(t, st, a.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
	ctx := ctxT(t, 5*time.Minute)
	if res, err := execIn(ctx, a.Node, s, "echo kept > /workspace/f"); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	a.stop(t)
	info, err := d.Info(ctx, s.ID)
	if err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("after the node stopped its guest is %+v (%v), want running", info, err)
	}
	d2 := openCloudHVDriver(t, base, strings.TrimSuffix(d.CgroupPath(""), "/"))
	if info, err := d2.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("the new driver sees the guest %+v (%v), want running", info, err)
	}
	cfg2 := nodeConfig(t, st, nil, dataDir, "node_chv_restart")
	cfg2.Driver = d2
	restarted := time.Now()
	b := startNode(t, cfg2)
	// startNode returns on the first node's registration; the new node heartbeats only once
	// it has recovered its guests.
	for {
		nodes, err := st.Nodes(ctx)
		if err == nil && slices.ContainsFunc(nodes, func(i store.NodeInfo) bool { return i.ID == cfg2.Info.ID && i.HeartbeatAt.After(restarted) }) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the restarted node never heartbeated")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res, err := execIn(ctx, b.Node, s, "cat /workspace/f"); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("exec through the restarted node: %+v, %v", res, err)
	}
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	end, _ := waitState(t, st, project, s.ID, time.Minute, session.Stopped, session.Failed, session.Expired)
	checkEnded(t, end, session.Failed, session.GuestCrash)
}

// TestCloudHVSession runs a session's lifecycle on a node whose back end is the cloudhv
// driver over the fake VMM: provision (the agent reached over hybrid vsock), exec, pause,
// resume, a disk snapshot, and a new session restored from it holding the file.
func TestCloudHVSession(t *testing.T) {
	t.Parallel()
	const project = "proj_chv"
	st, _ := newStore(t)
	d := newCloudHVDriver(t, tempDir(t))
	cfg := nodeConfig(t, st, nil, tempDir(t), "node_chv")
	cfg.Driver = d // not wrapped: the node must see its AgentDialer
	n := startNode(t, cfg)
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
	if mem, size, err := n.Snapshot(ctx, s, snapID, true); err != nil || mem || size <= 0 {
		t.Fatalf("snapshot: memory %v size %d err %v", mem, size, err)
	}
	if res, err := execIn(ctx, n.Node, s, "echo after > /workspace/g"); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec after the snapshot: %+v, %v", res, err)
	}

	restored := restoredSession(t, st, project, n.Info.ID, snapID)
	if err := n.Provision(ctxT(t, 3*time.Minute), n.Info, restored); err != nil {
		t.Fatalf("provision from the snapshot: %v", err)
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
