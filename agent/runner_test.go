package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// testLoader is a bare python3 runner: ready on fd 4, the frame from fd 3, the code run.
const testLoader = `import os, sys
os.write(4, b"r")
os.close(4)
b = b""
while True:
    c = os.read(3, 65536)
    if not c:
        break
    b += c
head, _, code = b.partition(b"\0\0")
exec(code.decode())
`

func python(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on this host")
	}
	return py
}

// TestRunner: an exec naming a waiting runner runs in the runner's process, started before
// the exec (its pid is the runner's); the runner serves one exec, and the next runs as usual.
func TestRunner(t *testing.T) {
	py := python(t)
	c, _ := startAgent(t, false)
	ctx := testCtx(t, time.Minute)
	pid, err := c.StartRunner(ctx, RunnerRequest{Name: "py", Argv: []string{py, "-c"}, Loader: testLoader})
	if err != nil {
		t.Fatal(err)
	}
	req := ExecRequest{Argv: []string{py, "-c", "import os, sys; print(os.getpid()); print(sys.stdin.read(), file=sys.stderr); sys.exit(5)"},
		Stdin: []byte("in"), Runner: "py"}
	res, err := c.Exec(ctx, req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(res.Stdout) != strconv.Itoa(pid) || res.Stderr != "in\n" || res.ExitCode != 5 {
		t.Fatalf("exec through the runner (pid %d): stdout %q stderr %q exit %d; want its pid, the stdin, exit 5", pid, res.Stdout, res.Stderr, res.ExitCode)
	}
	res, err = c.Exec(ctx, req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(res.Stdout) == strconv.Itoa(pid) || res.Stderr != "in\n" || res.ExitCode != 5 {
		t.Fatalf("second exec: stdout %q stderr %q exit %d; want a new process", res.Stdout, res.Stderr, res.ExitCode)
	}
}

// TestRunnerFallbacks: an exec whose argv does not fit the runner runs as usual and leaves the
// runner waiting; one whose runner died meanwhile runs as usual too.
func TestRunnerFallbacks(t *testing.T) {
	py := python(t)
	c, _ := startAgent(t, false)
	ctx := testCtx(t, time.Minute)
	pid, err := c.StartRunner(ctx, RunnerRequest{Name: "py", Argv: []string{py, "-c"}, Loader: testLoader})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "echo $$"}, Runner: "py"}, nil)
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) == strconv.Itoa(pid) {
		t.Fatalf("sh through a python runner: %+v %v", res, err)
	}
	code := "import os; print(os.getpid())"
	res, err = c.Exec(ctx, ExecRequest{Argv: []string{py, "-c", code}, Runner: "py"}, nil)
	if err != nil || strings.TrimSpace(res.Stdout) != strconv.Itoa(pid) {
		t.Fatalf("the runner was not left waiting by the exec that did not fit: %+v %v", res, err)
	}
	pid, err = c.StartRunner(ctx, RunnerRequest{Name: "py", Argv: []string{py, "-c"}, Loader: testLoader})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitPidGone(t, pid)
	time.Sleep(50 * time.Millisecond) // its waiter notices
	res, err = c.Exec(ctx, ExecRequest{Argv: []string{py, "-c", code}, Runner: "py"}, nil)
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) == strconv.Itoa(pid) || strings.TrimSpace(res.Stdout) == "" {
		t.Fatalf("after its runner died, the exec answered %+v %v; want it run as usual", res, err)
	}
}

// TestRunnerTimeout: an exec in a runner is killed at its timeout like any other.
func TestRunnerTimeout(t *testing.T) {
	py := python(t)
	c, _ := startAgent(t, false)
	ctx := testCtx(t, time.Minute)
	pid, err := c.StartRunner(ctx, RunnerRequest{Name: "py", Argv: []string{py, "-c"}, Loader: testLoader})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{py, "-c", "import time; print('up', flush=True); time.sleep(60)"}, Runner: "py", TimeoutS: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.ExitCode != ExitTimedOut || res.Stdout != "up\n" {
		t.Fatalf("exec past its timeout: %+v", res)
	}
	if el := time.Since(start); el > 30*time.Second {
		t.Fatalf("the timed-out exec took %s", el)
	}
	waitPidGone(t, pid)
}

// TestRunnerLoaderFails: a loader that exits before it is ready is an error quoting its
// stderr, and no runner waits.
func TestRunnerLoaderFails(t *testing.T) {
	py := python(t)
	c, _ := startAgent(t, false)
	ctx := testCtx(t, time.Minute)
	_, err := c.StartRunner(ctx, RunnerRequest{Name: "py", Argv: []string{py, "-c"}, Loader: "import sys; sys.stderr.write('no interpreter today'); sys.exit(3)"})
	var ae *Error
	if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != "runner_failed" || !strings.Contains(ae.Message, "no interpreter today") || !strings.Contains(ae.Message, "exit code 3") {
		t.Fatalf("StartRunner with a failing loader: %v", err)
	}
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{py, "-c", "print(6*7)"}, Runner: "py"}, nil)
	if err != nil || res.Stdout != "42\n" || res.ExitCode != 0 {
		t.Fatalf("exec after the runner failed: %+v %v", res, err)
	}
	_, err = c.StartRunner(ctx, RunnerRequest{Name: "py", Argv: []string{py, "-c"}, Loader: "import time; time.sleep(60)", ReadyTimeoutS: 1})
	if !errors.As(err, &ae) || ae.Status != 502 || !strings.Contains(ae.Message, "not ready within") {
		t.Fatalf("StartRunner with a loader never ready: %v", err)
	}
	_, err = c.StartRunner(ctx, RunnerRequest{Name: "", Argv: []string{py}, Loader: "x"})
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != "name" {
		t.Fatalf("StartRunner without a name: %v", err)
	}
}

// TestRunnersWakeTheGuard: a waiting runner counts as idle for the fork-bomb guard, and both
// a start and a claim wake it (asleep, it would not see the code the runner then runs fork).
func TestRunnersWakeTheGuard(t *testing.T) {
	py := python(t)
	s := &server{procs: newProcTable(), runners: map[string]*waitingRunner{}, root: t.TempDir(), log: slog.New(slog.DiscardHandler)}
	woke := func() bool {
		select {
		case <-s.procs.started:
			return true
		default:
			return false
		}
	}
	r := httptest.NewRequest("POST", "/v1/runners", nil)
	if _, err := s.startRunner(r, RunnerRequest{Name: "py", Argv: []string{py, "-c"}, Loader: testLoader}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if !woke() {
		t.Error("a runner started: the guard was not woken")
	}
	if n := s.waitingRunners(); n != 1 {
		t.Errorf("waiting runners: %d, want 1", n)
	}
	p := s.claimRunner(execSpec{argv: []string{py, "-c", "pass"}, dir: s.root, runner: "py"})
	if p == nil {
		t.Fatal("the runner was not claimed")
	}
	if !woke() {
		t.Error("a runner claimed: the guard was not woken")
	}
	if n := s.waitingRunners(); n != 0 {
		t.Errorf("waiting runners after the claim: %d, want 0", n)
	}
	select {
	case <-p.waited:
	case <-time.After(time.Minute):
		t.Fatal("the claimed runner did not exit")
	}
	_, _ = p.outR.Close(), p.errR.Close()
}

// TestStartingRunnerIsIdle: a runner whose interpreter is still starting counts as idle for
// the fork-bomb guard, as it will once ready (it forks nothing before its exec): counted as a
// guest process, it kept the guard sampling every 100-200 ms through each pool guest's
// interpreter start. One that fails to start counts no more.
func TestStartingRunnerIsIdle(t *testing.T) {
	py := python(t)
	s := &server{procs: newProcTable(), runners: map[string]*waitingRunner{}, root: t.TempDir(), log: slog.New(slog.DiscardHandler)}
	dir := t.TempDir()
	started, goOn := filepath.Join(dir, "started"), filepath.Join(dir, "go-on")
	loader := "import os, time\nopen(" + strconv.Quote(started) + ", 'w').close()\n" +
		"while not os.path.exists(" + strconv.Quote(goOn) + "):\n    time.sleep(0.01)\n" + testLoader
	r := httptest.NewRequest("POST", "/v1/runners", nil)
	errc := make(chan error, 1)
	go func() {
		_, err := s.startRunner(r, RunnerRequest{Name: "py", Argv: []string{py, "-c"}, Loader: loader}, time.Minute)
		errc <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the runner's loader did not start within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.waitingRunners(); n != 1 {
		t.Errorf("a runner still starting: waiting runners %d, want 1 (idle for the guard)", n)
	}
	if err := os.WriteFile(goOn, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if n := s.waitingRunners(); n != 1 {
		t.Errorf("the runner ready: waiting runners %d, want 1", n)
	}
	s.dropRunners()

	// A loader that exits before it is ready leaves nothing counted.
	if _, err := s.startRunner(r, RunnerRequest{Name: "bad", Argv: []string{py, "-c"}, Loader: "raise SystemExit(3)"}, time.Minute); err == nil {
		t.Fatal("a loader that exits at once: the runner started")
	}
	if n := s.waitingRunners(); n != 0 {
		t.Errorf("after a runner that failed to start: waiting runners %d, want 0", n)
	}
}

// TestBombGuardAfterARunnerDied: a waiting runner that died (a guest process killed it, or
// the guard's own kill of every process did) no longer counts as idle. Counted, a process
// left alone beside it looked like the runner, the guard slept, and nothing woke it when that
// process then forked to the limit.
func TestBombGuardAfterARunnerDied(t *testing.T) {
	py := python(t)
	s := &server{procs: newProcTable(), runners: map[string]*waitingRunner{}, root: t.TempDir(), log: slog.New(slog.DiscardHandler)}
	r := httptest.NewRequest("POST", "/v1/runners", nil)
	rpid, err := s.startRunner(r, RunnerRequest{Name: "py", Argv: []string{py, "-c"}, Loader: testLoader}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	wr := s.runners["py"]
	s.mu.Unlock()
	defer wr.close()

	const every = 10 * time.Millisecond
	count := &fakeCount{}
	count.set(1) // the runner
	ended := make(chan time.Time, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		bombGuard{max: 100, every: every, slowest: 8 * every, count: count.read, idle: s.waitingRunners, woken: s.procs.started,
			endAll: func(since time.Time) { ended <- since }}.run(ctx)
	}()
	defer func() { cancel(); <-done }()
	sampledOnce := func(what string) {
		t.Helper()
		before := count.sampled()
		deadline := time.Now().Add(30 * time.Second)
		for count.sampled() <= before {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the guard took no sample in 30 s", what)
			}
			time.Sleep(every)
		}
	}

	// An exec starts beside the runner, then kills it and stays alone a while.
	count.set(2)
	s.procs.wake()
	sampledOnce("an exec started")
	if err := syscall.Kill(rpid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-wr.p.waited
	count.set(1)
	sampledOnce("the runner killed")
	time.Sleep(4 * every)

	// It forks to the limit.
	count.set(100)
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatalf("a count at the limit for 30 s beside a dead runner: the guard never ended them (it took %d samples in all; waiting runners: %d)", count.sampled(), s.waitingRunners())
	}
}

// TestQueuedRunnerStartsHideNoBomb is an attack on the guard's count of starting runners:
// under gVisor guest root reaches the agent's socket and may send runner requests as fast as
// it likes. Forks are made one at a time (the spawner, under the process table's lock), and a
// bomb keeps that path busy, so requests queue there with no process yet. Counted as idle each,
// they hid as many of the bomb's processes from the guard: one the guard found at its limit
// took the bomb for waiting runners and slept again, and the bomb was never ended.
func TestQueuedRunnerStartsHideNoBomb(t *testing.T) {
	py := python(t)
	s := &server{procs: newProcTable(), runners: map[string]*waitingRunner{}, root: t.TempDir(), log: slog.New(slog.DiscardHandler)}
	const max = 10
	s.procs.mu.Lock() // the fork path busy: each queued start waits its turn
	locked := true
	unlock := func() {
		if locked {
			locked = false
			s.procs.mu.Unlock()
		}
	}
	defer unlock()
	rctx, gone := context.WithCancel(context.Background())
	r := httptest.NewRequest("POST", "/v1/runners", nil).WithContext(rctx)
	var starts sync.WaitGroup
	defer func() {
		gone() // each start, once its turn comes, finds its caller gone and kills its runner
		unlock()
		starts.Wait()
		s.dropRunners()
	}()
	for i := range max {
		starts.Go(func() {
			_, _ = s.startRunner(r, RunnerRequest{Name: "r" + strconv.Itoa(i), Argv: []string{py, "-c"}, Loader: testLoader}, time.Minute)
		})
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		queued := s.runnerStarts
		s.mu.Unlock()
		if queued == max {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runner starts queued within a minute", queued, max)
		}
	}
	if n := s.waitingRunners(); n > 1 {
		t.Errorf("%d runner starts queued, no runner process yet: waiting runners %d, want at most 1 (the start whose fork may be under way)", max, n)
	}
	count := &fakeCount{}
	count.set(max) // the bomb at its limit
	ended := make(chan time.Time, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		bombGuard{max: max, every: 10 * time.Millisecond, slowest: 80 * time.Millisecond, asleep: 50 * time.Millisecond,
			count: count.read, idle: s.waitingRunners, woken: s.procs.started,
			endAll: func(since time.Time) {
				select {
				case ended <- since:
				default:
				}
			}}.run(ctx)
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Errorf("a bomb at its limit beside %d queued runner starts: not ended in 30 s (%d samples)", max, count.sampled())
	}
}
