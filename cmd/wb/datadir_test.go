//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor/oci"
	"wb/internal/datadir"
	"wb/internal/fleet"
	"wb/internal/wbbin"
)

// TestServeRefusesABusyDataDir: a second `wb serve` on the data dir of a running one returns
// at once with the lock's message, and the first keeps serving.
func TestServeRefusesABusyDataDir(t *testing.T) {
	dir := t.TempDir()
	env := startServe(t, "--data-dir", dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--runtime", "none", "--data-dir", dir, "--log-level", "error"}, io.Discard, io.Discard)
	var held *datadir.HeldError
	if !errors.As(err, &held) || held.Holder.PID != os.Getpid() || held.Holder.Command != "wb serve" {
		t.Fatalf("second wb serve on %s: %v, want the lock's message naming wb serve, pid %d", dir, err, os.Getpid())
	}
	if ctx.Err() != nil {
		t.Fatal("the second wb serve waited for the lock instead of failing at once")
	}
	if got := getStatus(t, env["WB_URL"]+"/v1/templates", env["WB_API_KEY"]); got != 200 {
		t.Fatalf("the first wb serve after the second was refused: GET /v1/templates %d", got)
	}
}

// TestNodeRefusesABusyDataDir: `wb node` takes the same lock, before it reaches Redis.
func TestNodeRefusesABusyDataDir(t *testing.T) {
	dir := t.TempDir()
	lock, err := datadir.Acquire(dir, "wb serve")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("wb_node_x"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = run(ctx, []string{"node", "--redis", "redis://127.0.0.1:1/0", "--token-file", tokenFile, "--addr", "127.0.0.1:0",
		"--runtime", "runc", "--data-dir", dir}, io.Discard, io.Discard)
	var held *datadir.HeldError
	if !errors.As(err, &held) || held.Holder.Command != "wb serve" || held.Holder.PID != os.Getpid() {
		t.Fatalf("wb node on a locked data dir: %v, want the lock's message naming wb serve, pid %d", err, os.Getpid())
	}
}

// TestTwoServesOneDataDirKeepGuests runs the real binary under runsc: a second `wb serve` on
// the data dir of a running one exits non-zero with the lock's message and leaves the first
// one's warm guests running; after the first is killed with SIGKILL (its gVisor sandboxes
// live on), a new `wb serve` takes the data dir and reaps them as orphans.
func TestTwoServesOneDataDirKeepGuests(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runsc needs root")
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Skip("runsc is not installed (apt-get install runsc)")
	}
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	// Not t.TempDir(): the test's name would make the guests' Unix socket paths too long.
	tmp, err := os.MkdirTemp("", "wb-dd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	bin, err := wbbin.Install(tmp)
	if err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(tmp, "d")
	stateRoot := oci.RunLayout(dataDir).StateRoot // cmd/wb newDriver: a fresh data dir's state is on its run dir
	// Whatever happens, no sandbox or mount of this test outlives it (a wb killed with
	// SIGKILL leaves both).
	t.Cleanup(func() {
		if err := fleet.Reap(context.Background(), "runsc", dataDir, fleet.ServeNodeID); err != nil {
			t.Logf("wb serve's guests: %v", err)
		}
		fleet.UnmountUnder(tmp)
	})
	args := []string{"serve", "--addr", "127.0.0.1:0", "--runtime", "runsc", "--pool", "1", "--run-pool", "0", "--data-dir", dataDir}

	first := startBinary(t, bin, args...)
	// The warm pools hold one guest per template (tpl_desktop's only where Chromium is
	// installed); all of them boot before the second starts, so none boots meanwhile.
	templates := templateCount(t, first.env["WB_URL"], first.env["WB_API_KEY"])
	var guests map[string]int
	awaitCondition(t, 5*time.Minute, fmt.Sprintf("the first wb serve's %d warm guests running", templates), func() bool {
		guests = runningGuests(t, runsc, stateRoot)
		return len(guests) == templates
	})

	// Bounded: were the data dir not locked, the second would serve on.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	second := exec.CommandContext(ctx, bin, args...)
	second.Env = withoutWBEnv()
	var out strings.Builder
	second.Stdout, second.Stderr = &out, &out
	started := time.Now()
	err = second.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("second wb serve on the same data dir: %v, want a non-zero exit; output:\n%s", err, out.String())
	}
	for _, want := range []string{"is in use by wb serve (pid " + strconv.Itoa(first.cmd.Process.Pid) + ", since ", "another --data-dir"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("second wb serve's output lacks %q:\n%s", want, out.String())
		}
	}
	if took := time.Since(started); took > 20*time.Second {
		t.Errorf("the second wb serve took %v to give up; it should not wait", took)
	}
	if after := runningGuests(t, runsc, stateRoot); !sameGuests(guests, after) {
		t.Fatalf("the first wb serve's guests changed when the second was refused: before %v, after %v", guests, after)
	}
	if got := getStatus(t, first.env["WB_URL"]+"/v1/templates", first.env["WB_API_KEY"]); got != 200 {
		t.Fatalf("the first wb serve after the second was refused: GET /v1/templates %d", got)
	}

	// SIGKILL leaves the sandboxes running and the lock file behind, but not the lock.
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.exited
	if after := runningGuests(t, runsc, stateRoot); !sameGuests(guests, after) {
		t.Fatalf("the killed wb serve's sandboxes should outlive it: before %v, after %v", guests, after)
	}
	// No warm pool: it has only to reap, and booting new guests would only slow it down.
	third := startBinary(t, bin, "serve", "--addr", "127.0.0.1:0", "--runtime", "runsc", "--pool", "0", "--data-dir", dataDir)
	awaitCondition(t, 2*time.Minute, "the new wb serve reaping the killed one's guests", func() bool {
		after := runningGuests(t, runsc, stateRoot)
		for id := range guests {
			if _, ok := after[id]; ok {
				return false
			}
		}
		return true
	})
	if err := third.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-third.exited:
	case <-time.After(time.Minute):
		t.Fatalf("wb serve did not stop within a minute of SIGTERM; stderr:\n%s", third.stderr())
	}
}

type wbProcess struct {
	cmd        *exec.Cmd
	env        map[string]string
	exited     chan struct{}
	stderrPath string
}

func (p *wbProcess) stderr() string {
	b, _ := os.ReadFile(p.stderrPath)
	return string(b)
}

// startBinary starts bin with args and waits for its three lines (WB_URL, WB_API_KEY,
// WB_ADMIN_KEY); the process is stopped when the test ends.
func startBinary(t *testing.T, bin string, args ...string) *wbProcess {
	t.Helper()
	p := &wbProcess{env: map[string]string{}, exited: make(chan struct{}), stderrPath: filepath.Join(t.TempDir(), "stderr")}
	stderr, err := os.Create(p.stderrPath)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = withoutWBEnv()
	p.cmd.Stderr = stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // if the test dies, so does wb
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(time.Minute):
			_ = p.cmd.Process.Kill()
			t.Errorf("%s did not stop within a minute of SIGTERM", bin)
		}
	})
	deadline := time.After(2 * time.Minute)
	for len(p.env) < 3 {
		select {
		case l, ok := <-lines:
			if !ok {
				<-p.exited
				t.Fatalf("wb %s exited before printing its URL and keys; stderr:\n%s", args[0], p.stderr())
			}
			k, v, _ := strings.Cut(l, "=")
			p.env[k] = v
		case <-deadline:
			t.Fatalf("wb %s printed no URL and keys in 2 minutes; stderr:\n%s", args[0], p.stderr())
		}
	}
	go func() {
		for range lines {
		}
	}()
	return p
}

// withoutWBEnv is this process's environment without $WB_*, so that wb makes fresh keys.
func withoutWBEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WB_") {
			env = append(env, kv)
		}
	}
	return env
}

// runningGuests answers the running containers under a runsc state root, by id, with their
// pids. A state file runsc cannot read fails the test.
func runningGuests(t *testing.T, runsc, root string) map[string]int {
	t.Helper()
	out, err := exec.Command(runsc, "--root", root, "list", "-format", "json").Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("runsc list --root %s: %v\n%s", root, err, exit.Stderr)
		}
		t.Fatalf("runsc list --root %s: %v", root, err)
	}
	var states []struct {
		ID     string `json:"id"`
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &states); err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	running := map[string]int{}
	for _, s := range states {
		if s.Status == "running" {
			running[s.ID] = s.Pid
		}
	}
	return running
}

// templateCount answers how many templates wb serve at url offers.
func templateCount(t *testing.T, url, key string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/v1/templates", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) == 0 {
		t.Fatalf("GET /v1/templates: %d %v", resp.StatusCode, err)
	}
	return len(list.Data)
}

func sameGuests(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for id, pid := range a {
		if b[id] != pid {
			return false
		}
	}
	return true
}

// awaitCondition polls cond until it holds, failing the test after timeout.
func awaitCondition(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestServeNodeTokenFile: a --node-token-file that cannot be read, or holds nothing, stops
// wb serve with the flag's name, before it serves anything.
func TestServeNodeTokenFile(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{filepath.Join(t.TempDir(), "missing"), empty} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		err := run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--runtime", "none", "--data-dir", t.TempDir(), "--node-token-file", file, "--log-level", "error"}, io.Discard, io.Discard)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "--node-token-file") {
			t.Errorf("--node-token-file %s: %v, want an error naming the flag", file, err)
		}
	}
}
