//go:build linux

package servetest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"wb/internal/fleet"
	"wb/internal/wbbin"
)

// Server is a `wb serve --runtime runc --pool 0` of the test's own (with its own redis-server).
type Server struct {
	URL, APIKey string
	// Bin is the wb binary it runs, for tests that run other wb commands against it.
	Bin    string
	stderr string // path of its log
}

// LoadedColdStarts are the flags of a wb serve in tests: every tier is allowed 20 s cold
// starts (a 60 s provisioning deadline), not the production 2, 3, 5 and 10 s. Beside other
// packages' guests on a 2-core machine, a runc start once took longer than tier 2's 9 s, and
// a desktop's (tier 4) start from its disk snapshot does more than a session's.
func LoadedColdStarts() []string {
	var flags []string
	for tier := 1; tier <= 4; tier++ {
		flags = append(flags, "--cold-p95", fmt.Sprintf("%d=20s", tier))
	}
	return flags
}

// Start builds wb and its agent (or copies the ones wbbin's variables name), starts `wb
// serve` with real runc guests, and stops it and removes its guests and mounts when the test
// ends. Skips where runc cannot run. extraArgs are more flags of wb serve, e.g.
// --allow-private-webhooks. Its tiers' cold starts are LoadedColdStarts'.
func Start(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runc guests need root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed")
	}
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	// Not t.TempDir(): the test's name would make the guests' Unix socket paths too long.
	tmp, err := os.MkdirTemp("", "wbst")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil { // the guest's user must reach the agent binary
		t.Fatal(err)
	}
	bin, err := wbbin.Install(tmp)
	if err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(tmp, "d")
	s := &Server{Bin: bin, stderr: filepath.Join(tmp, "stderr")}
	stdoutPath := filepath.Join(tmp, "stdout")
	stdout, err := os.Create(stdoutPath)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(s.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd := exec.Command(bin, append([]string{"serve", "--addr", "127.0.0.1:0", "--runtime", "runc", "--pool", "0", "--data-dir", dataDir}, append(LoadedColdStarts(), extraArgs...)...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WB_") { // wb serve takes its keys from these when set
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // if the test dies, so does wb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
		if err := fleet.Reap(context.Background(), "runc", dataDir, fleet.ServeNodeID); err != nil {
			t.Logf("servetest: wb serve's guests: %v", err) // what a leak left is the machine's, not the test's
		}
		fleet.UnmountUnder(tmp)
	})
	deadline := time.Now().Add(3 * time.Minute) // a cold, loaded machine's first start does the most
	for {
		vals := readEnvLines(stdoutPath)
		if vals["WB_URL"] != "" && vals["WB_API_KEY"] != "" {
			s.URL, s.APIKey = vals["WB_URL"], vals["WB_API_KEY"]
			return s
		}
		select {
		case <-exited:
			t.Fatalf("wb serve exited before printing WB_URL and WB_API_KEY; log:\n%s", s.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("wb serve printed no WB_URL/WB_API_KEY within 3 minutes; log:\n%s", s.Log())
		}
	}
}

// Log answers the end of the server's log, for a failure's message.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.stderr)
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

func readEnvLines(path string) map[string]string {
	out := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			out[k] = v
		}
	}
	return out
}
