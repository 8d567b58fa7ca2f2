package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/node"
	"wb/session"
)

// lowPidsDriver is the node's test driver whose runsc sandboxes get a host process limit of
// max once launched (before the node watches them, which reads the limit once), far below
// the least a runsc sandbox is given (8,192), so that a test of it stays small.
type lowPidsDriver struct {
	hypervisor.Driver
	dir func(id string) string // the guest's pids cgroup directory
	max int
}

func (d lowPidsDriver) Launch(ctx context.Context, s hypervisor.Spec) error {
	if err := d.Driver.(hypervisor.Launcher).Launch(ctx, s); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d.dir(s.ID), "pids.max"), []byte(strconv.Itoa(d.max)), 0)
}

func (d lowPidsDriver) OOMKills(ctx context.Context, id string) (int64, error) {
	return d.Driver.(hypervisor.OOMCounter).OOMKills(ctx, id)
}

// pidsCgroupDir is the pids cgroup directory of cgroupsPath p on this host (v2 or v1).
func pidsCgroupDir(p string) string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return filepath.Join("/sys/fs/cgroup", p)
	}
	return filepath.Join("/sys/fs/cgroup/pids", p)
}

// TestSandboxPidsEnded is the attack the agent's own fork-bomb guard cannot see: 20 loops
// that each run `sh -c :` over and over keep some 40 processes alive in a guest allowed 64
// (a small session), never near that limit, while under gVisor's ptrace platform every
// process they start grows the sandbox's host tasks (runsc keeps its stub processes and
// their threads), toward the sandbox's host limit, where the sandbox dies with the session.
// The node watches that count and, at half the limit, has the agent end the guest's
// processes: the bomb's exec ends, the count stops short of the limit, and the session runs
// on and answers an exec. The sandbox's host limit is lowered to 2,000 here (a session's is
// 12,416), so that the bomb stays small; without the node's watch it reached 2,000 in
// about 5 s and the sandbox died (the session failed with guest_crash).
func TestSandboxPidsEnded(t *testing.T) {
	const hostMax = 2000
	st, _ := newStore(t)
	d := newDriver(t, "runsc", tempDir(t))
	cfg := nodeConfig(t, st, d, tempDir(t), "node_sandboxpids")
	dir := func(id string) string { return pidsCgroupDir(d.CgroupPath(id)) }
	cfg.Driver = lowPidsDriver{Driver: cfg.Driver, dir: dir, max: hostMax}
	n := startNode(t, cfg)
	const project = "proj_sandboxpids"
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	ids, err := d.List(ctxT(t, 30*time.Second))
	if err != nil || len(ids) != 1 {
		t.Fatalf("the node's guests: %v, %v; want one", ids, err)
	}
	cg := dir(ids[0])
	read := func(file string) string {
		b, _ := os.ReadFile(filepath.Join(cg, file))
		return strings.Join(strings.Fields(string(b)), " ")
	}
	if got := read("pids.max"); got != strconv.Itoa(hostMax) {
		t.Fatalf("the sandbox's pids.max is %q; want %d", got, hostMax)
	}

	// The host count, every 100 ms, while the bomb runs and until the test looks after it.
	var mu sync.Mutex
	var peak int
	var trace []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t0 := time.Now()
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			cur, err := strconv.Atoi(read("pids.current"))
			if err != nil {
				continue // the sandbox's cgroup is gone
			}
			mu.Lock()
			peak = max(peak, cur)
			if i%5 == 0 {
				trace = append(trace, fmt.Sprintf("%.1fs:%d", time.Since(t0).Seconds(), cur))
			}
			mu.Unlock()
		}
	})
	defer func() { close(stop); wg.Wait() }()

	// Bounded by itself (20 loops), by the guest's limit (64) and by the exec's time limit.
	const bomb = `for i in $(seq 20); do (while :; do sh -c : ; done) & done; wait`
	req, limit := execReq(bomb), 60
	req.TimeoutS = &limit
	res, err := n.Exec(ctxT(t, 2*time.Minute), s, req, nil, nil)
	took := time.Since(t0)
	t.Logf("the bomb's exec: exit %d, timed out %v, err %v, after %v", res.ExitCode, res.TimedOut, err, took.Round(time.Millisecond))
	tries, err := answersAfterTheEnd(n.Node, s, "echo alive", "alive")
	mu.Lock()
	t.Logf("the sandbox's host tasks: %s; peak %d of %d; pids.events: %s; execs before the guest answered: %q", strings.Join(trace, " "), peak, hostMax, read("pids.events"), tries)
	mu.Unlock()
	if err != nil {
		t.Errorf("an exec after the bomb: %v", err)
	}
	if got := get(t, st, project, s.ID); got.State != session.Running {
		t.Errorf("after the bomb the session is %s (%s); want running", got.State, reasonOf(got))
	}
	if res.TimedOut || took > 50*time.Second {
		t.Errorf("the bomb ran %v, until its exec's time limit: nothing ended it", took.Round(time.Millisecond))
	}
	mu.Lock()
	defer mu.Unlock()
	if ev := read("pids.events"); peak >= hostMax || ev != "" && ev != "max 0" {
		t.Errorf("the sandbox's host tasks reached %d of its limit %d (pids.events %q); want them held below", peak, hostMax, ev)
	}
}

// TestSandboxPidsNodeRestartEndsNothing: a sandbox whose host tasks an ended bomb left past
// half its limit (they do not fall back) keeps its guest's processes when a new node adopts
// it: the new node's watch starts at that count, and has the agent end them only should it
// grow by another eighth. It reported that count at its first poll, and a background process
// the guest ran (no bomb) was ended at each node's restart.
func TestSandboxPidsNodeRestartEndsNothing(t *testing.T) {
	const hostMax = 2000
	const id = "node_sandboxpidsrestart"
	st, _ := newStore(t)
	base, dataDir := tempDir(t), tempDir(t)
	d := newDriver(t, "runsc", base)
	dir := func(gid string) string { return pidsCgroupDir(d.CgroupPath(gid)) }
	cfg := nodeConfig(t, st, d, dataDir, id)
	cfg.Driver = lowPidsDriver{Driver: cfg.Driver, dir: dir, max: hostMax}
	a := startNode(t, cfg)
	const project = "proj_sandboxpidsrestart"
	s := provision(t, st, a.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	ids, err := d.List(ctxT(t, 30*time.Second))
	if err != nil || len(ids) != 1 {
		t.Fatalf("the node's guests: %v, %v; want one", ids, err)
	}
	cur := func() int {
		b, _ := os.ReadFile(filepath.Join(dir(ids[0]), "pids.current"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	const bomb = `for i in $(seq 20); do (while :; do sh -c : ; done) & done; wait`
	req, limit := execReq(bomb), 60
	req.TimeoutS = &limit
	res, err := a.Exec(ctxT(t, 2*time.Minute), s, req, nil, nil)
	t.Logf("the bomb's exec: exit %d, timed out %v, err %v; the sandbox's host tasks after it: %d of %d", res.ExitCode, res.TimedOut, err, cur(), hostMax)
	if n := cur(); n < hostMax/2 {
		t.Skipf("the sandbox's host tasks fell back to %d of %d after the bomb: nothing to test", n, hostMax)
	}
	if _, err := answersAfterTheEnd(a.Node, s, "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo started", "started"); err != nil {
		t.Fatalf("start a background process: %v", err)
	}
	a.stop(t)
	d2 := openDriver(t, "runsc", base, strings.TrimSuffix(d.CgroupPath(""), "/"))
	b := startNode(t, nodeConfig(t, st, d2, dataDir, id))
	if _, err := execIn(ctxT(t, time.Minute), b.Node, s, "true"); err != nil {
		t.Fatalf("an exec after the node's restart: %v", err)
	}
	time.Sleep(3 * time.Second) // 15 polls of the new node's watch
	res, err = execIn(ctxT(t, time.Minute), b.Node, s, `for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sleep ] && { echo running; exit; }; done; echo gone`)
	t.Logf("after the node's restart the sandbox's host tasks: %d of %d", cur(), hostMax)
	if err != nil || !strings.Contains(res.Stdout, "running") {
		t.Errorf("the guest's background process after a new node adopted it: %q, %v; want it running", res.Stdout, err)
	}
	if got := get(t, st, project, s.ID); got.State != session.Running {
		t.Errorf("after the node's restart the session is %s (%s); want running", got.State, reasonOf(got))
	}
}

// answersAfterTheEnd runs cmd in s until its output holds want, for up to 20 s, and answers
// the runs that did not: a bomb's exec ends at the agent's first kill round, and until the
// end is done the guest's starts are refused (or killed by a later round), by design.
func answersAfterTheEnd(n *node.Node, s *session.Session, cmd, want string) ([]string, error) {
	var tries []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		res, err := execIn(ctx, n, s, cmd)
		cancel()
		if err == nil && strings.Contains(res.Stdout, want) {
			return tries, nil
		}
		tries = append(tries, fmt.Sprintf("exit %d, stdout %q, stderr %q, err %v", res.ExitCode, res.Stdout, res.Stderr, err))
		if time.Now().After(deadline) {
			return tries, fmt.Errorf("no answer %q in 20 s: %s", want, strings.Join(tries, "; "))
		}
	}
}
