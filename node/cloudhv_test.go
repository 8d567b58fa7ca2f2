package node_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
	"wb/hypervisor/cloudhv/image"
	"wb/hypervisor/templates"
	"wb/internal/wbbin"
	"wb/session"
	"wb/store"
)

// fakeCH is the fake Cloud Hypervisor's command (chvtest/fakech), built once per test binary,
// and the rootfs image cache every cloudhv test driver shares: made there once, tpl_base's
// image saves each test its own mkfs (at once, a dozen of them starve the machine).
var fakeCH struct {
	once  sync.Once
	dir   string // removed by TestMain
	path  string
	cache string
	err   error
}

// fakeCHPath builds the fake VMM once per test binary and answers its path.
func fakeCHPath(t testing.TB) string {
	t.Helper()
	fakeCH.once.Do(func() {
		dir, err := os.MkdirTemp("", "wbn-fakech-")
		if err != nil {
			fakeCH.err = err
			return
		}
		fakeCH.dir = dir
		_ = os.Chmod(dir, 0o755)
		if fakeCH.path, err = wbbin.FakeCH(dir); err != nil {
			fakeCH.err = err
			return
		}
		fakeCH.cache = filepath.Join(dir, "cache")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if _, err := image.RootFSImage(ctx, fakeCH.cache, catalog[templates.Base].RootFS, wbBin); err != nil {
			fakeCH.err, fakeCH.path = err, "the rootfs image of "+templates.Base
		}
	})
	if fakeCH.err != nil {
		t.Fatalf("build fakech: %v\n%s", fakeCH.err, fakeCH.path)
	}
	return fakeCH.path
}

// openCloudHVDriver is a cloudhv driver over the fake VMM on base's state dir.
func openCloudHVDriver(t testing.TB, base, cgroupParent string) *cloudhv.Driver {
	t.Helper()
	bin := fakeCHPath(t)
	kernel := filepath.Join(base, "vmlinuz")
	if err := os.WriteFile(kernel, []byte("the fake VMM loads no kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := cloudhv.New(context.Background(), cloudhv.Options{Binary: bin, Kernel: kernel,
		StateDir: filepath.Join(base, "ch"), CacheDir: fakeCH.cache,
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
	d := newDriver(t, "cloudhv", base)
	a := startNode(t, nodeConfig(t, st, d, dataDir, "node_chv_restart"))
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
	d2 := openDriver(t, "cloudhv", base, strings.TrimSuffix(d.CgroupPath(""), "/"))
	if info, err := d2.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("the new driver sees the guest %+v (%v), want running", info, err)
	}
	cfg2 := nodeConfig(t, st, d2, dataDir, "node_chv_restart")
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
