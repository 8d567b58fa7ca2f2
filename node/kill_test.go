package node_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor/oci"
	"wb/internal/datadir"
	"wb/internal/redistest"
	"wb/internal/servetest"
	"wb/node/client"
	"wb/placer"
	"wb/quota"
	"wb/session"
	"wb/store"
)

// wbNode is a `wb node` subprocess.
type wbNode struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func startWBNode(t testing.TB, dataDir, redisAddr, token, id string, port int) *wbNode {
	t.Helper()
	logf, err := os.CreateTemp(t.TempDir(), "wb-node-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// Loaded cold starts, as the test's placer has: the node ends a start at the tier's
	// provisioning deadline too.
	cmd := exec.Command(serverBin, append([]string{"node", "--redis", "redis://" + redisAddr, "--addr", "127.0.0.1:" + strconv.Itoa(port),
		"--data-dir", dataDir, "--runtime", "runsc", "--pool", "0", "--id", id, "--region", "local", "--log-level", "debug"},
		servetest.LoadedColdStarts()...)...)
	cmd.Env = append(os.Environ(), "WB_NODE_TOKEN="+token) // never on the command line
	cmd.Stdout, cmd.Stderr = logf, logf                    // a file, not a pipe: guests must not hold the test's pipe open
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &wbNode{cmd: cmd, done: make(chan struct{}), log: logf.Name()}
	go func() { _ = cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		w.signal(syscall.SIGKILL)
		<-w.done
		if t.Failed() || os.Getenv("WB_TEST_NODE_LOGS") != "" {
			b, _ := os.ReadFile(w.log)
			t.Logf("wb node %s log:\n%s", id, b)
		}
	})
	return w
}

func (w *wbNode) signal(sig syscall.Signal) {
	select {
	case <-w.done:
	default:
		_ = w.cmd.Process.Signal(sig)
	}
}

func (w *wbNode) wait(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(timeout):
		t.Fatalf("wb node did not exit within %v", timeout)
	}
}

// waitRegistered waits for the node's heartbeat registration, newer than after.
func waitRegistered(t testing.TB, st *store.Store, w *wbNode, id string, after time.Time) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		nodes, err := st.Nodes(context.Background())
		if err == nil && slices.ContainsFunc(nodes, func(n store.NodeInfo) bool { return n.ID == id && n.HeartbeatAt.After(after) }) {
			return
		}
		select {
		case <-w.done:
			b, _ := os.ReadFile(w.log)
			t.Fatalf("wb node exited before registering: %s\n%s", w.cmd.ProcessState, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("wb node %s did not register within 90 s (%v)", id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNodeKilled: a `wb node` killed with SIGKILL stops heartbeating; the placer fails its
// running session with host_failure and releases the slot. A new `wb node` on the same data
// dir reaps the orphaned guest of the ended session.
func TestNodeKilled(t *testing.T) {
	t.Parallel()
	const (
		project = "proj_k9"
		token   = "tok_k9"
		nodeID  = "node_k9"
		hbTO    = 3 * time.Second
	)
	rp := redistest.StartProc(t)
	st := store.New(redisClient(t, rp.Addr()))
	dataDir := tempDir(t)
	// The subprocess's guests, seen through a driver on the same runtime state as its own
	// (cmd/wb newDriver: state and bundles on the data dir's run dir, a tmpfs, cgroups under
	// /wb/<id>-<digest>), to check on them and to clean them up even if the test fails.
	l := oci.RunLayout(dataDir)
	hd, err := oci.New(oci.Options{Runtime: "runsc", StateRoot: l.StateRoot, BundleRoot: l.BundleRoot, DiskTemplates: l.DiskTemplates,
		CgroupParent: "/wb/" + datadir.CgroupName(dataDir, nodeID), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stateRoots.Store(hd, l.StateRoot)
	t.Cleanup(func() {
		reapAll(t, hd)
		_ = hd.RemoveCgroupParent()
		_ = syscall.Unmount(l.RunDir, syscall.MNT_DETACH) // the killed node's, left for its guests
	})

	t0 := time.Now()
	w := startWBNode(t, dataDir, rp.Addr(), token, nodeID, freePort(t))
	waitRegistered(t, st, w, nodeID, t0.Add(-time.Second))

	pctx, stopPlacer := context.WithCancel(context.Background())
	// Tiers as nodeConfig's: a cold run's busy cores took 8.6 s to create this runsc guest,
	// and the default 3 s cold start (a 9 s deadline) failed it with provision_timeout.
	p := placer.New(placer.Config{Store: st, Provisioner: client.New(st, token), HeartbeatTimeout: hbTO,
		Tiers: loadedTiers(20 * time.Second), Logger: testLogger(t)})
	placerDone := make(chan struct{})
	go func() { _ = p.Run(pctx); close(placerDone) }()
	t.Cleanup(func() { stopPlacer(); <-placerDone })

	s := newPending(t, st, project, sessionOpts{idleS: 300, lifeS: 600, template: "tpl_base"})
	// 70 s: past the tiers' 60 s provisioning deadline, so the session has run or failed.
	run, _ := waitState(t, st, project, s.ID, 70*time.Second, session.Running, session.Failed, session.Stopped, session.Expired)
	if run.State != session.Running || run.NodeID != nodeID {
		t.Fatalf("session is %s %s on %q, want running on %s", run.State, reasonOf(run), run.NodeID, nodeID)
	}
	ids, err := hd.List(ctxT(t, 10*time.Second))
	if err != nil || !slices.Contains(ids, s.ID) {
		t.Fatalf("the running session's guest is not in the node's runtime state: %v (%v)", ids, err)
	}

	settler := quota.NewSettler(redisClient(t, rp.Addr()), quota.SettlerOptions{Consumer: "test"})
	settle := func() int64 {
		for i := 0; i < 5; i++ {
			if _, err := settler.SettleProject(ctxT(t, time.Minute), project); err != nil {
				t.Fatal(err)
			}
		}
		return get(t, st, project, s.ID).UsageToDate.SessionS
	}
	// Wait for the node's first usage record (it flushes every 5 s), then kill it.
	for deadline := time.Now().Add(60 * time.Second); settle() < 1; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no usage record from the node within 60 s")
		}
	}
	w.signal(syscall.SIGKILL)
	w.wait(t, 30*time.Second)
	killed := time.Now()
	// The session's own timers are minutes away: an end within the bound is the heartbeat's,
	// and its reason says so. (A CI run at a load average of 94 saw the placer sweep late: the
	// bound is wide, the time is logged.)
	end, seen := waitState(t, st, project, s.ID, hbTO+45*time.Second, session.Failed, session.Stopped, session.Expired)
	checkEnded(t, end, session.Failed, session.HostFailure)
	t.Logf("host_failure %.1fs after the kill", seen.Sub(killed).Seconds())
	checkSlots(t, st, project)
	// Billing stops at the last usage event received: what was settled by the failure is all
	// there is, however long the orphaned guest lingers.
	billed := settle()
	if billed < 1 || float64(billed) > killed.Sub(run.StartedAt.Time).Seconds()+1 {
		t.Errorf("billed %d s for a session that ran %s before its node died", billed, killed.Sub(run.StartedAt.Time))
	}
	time.Sleep(6 * time.Second) // the point: longer than the 5 s flush, were anyone still metering
	if again := settle(); again != billed {
		t.Errorf("billing went on after the host failure: %d s, then %d s", billed, again)
	}
	// The guest outlives its node: nobody tears it down until a node starts on the data dir.
	ids, err = hd.List(ctxT(t, 10*time.Second))
	orphan := err == nil && slices.Contains(ids, s.ID)
	if orphan {
		_, desc := runtimeState(hd, s.ID)
		t.Logf("after the kill the guest is orphaned: %s", desc)
	} else {
		t.Log("after the kill the guest is gone")
	}

	// A new node on the same data dir: its recovery finds the session ended and reaps the guest.
	t1 := time.Now()
	w2 := startWBNode(t, dataDir, rp.Addr(), token, nodeID, freePort(t))
	waitRegistered(t, st, w2, nodeID, t1)
	if err := waitGuestGone(t, hd, s.ID, 90*time.Second); err != nil { // a loaded runsc delete took 17 s
		t.Errorf("the restarted node left the guest of the failed session: %v", err)
	}
	if ents, err := os.ReadDir(filepath.Join(dataDir, "node", "journal")); err != nil || len(ents) != 0 {
		t.Errorf("journal after the reap: %v (%v), want empty", ents, err)
	}
	if got := get(t, st, project, s.ID); got.State != session.Failed || got.StateReason == nil || *got.StateReason != session.HostFailure {
		t.Errorf("after the restart the session is %s %s, want failed (host_failure)", got.State, reasonOf(got))
	}
	w2.signal(syscall.SIGTERM)
	w2.wait(t, time.Minute)
	if code := w2.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("wb node exited %d after SIGTERM", code)
	}
}
