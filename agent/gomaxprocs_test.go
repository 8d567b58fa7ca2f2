package agent_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"wb/agent"
	"wb/internal/wbbin"
)

// TestGoMaxProcsFromEnv runs the agent binary with WB_AGENT_GOMAXPROCS=1, as the OCI driver
// starts a runsc guest's: its scheduler runs on one thread (Go's scheduler trace says so once
// it serves), and the commands it runs do not inherit the variable.
func TestGoMaxProcsFromEnv(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("Go's default is one thread here already")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a cold build of the agent, a busy machine
	defer cancel()
	dir := t.TempDir()
	bin, err := wbbin.Agent(dir)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "a.sock")
	cmd := exec.CommandContext(ctx, bin, "agent", "--socket", sock, "--root", filepath.Join(dir, "root"))
	cmd.Env = append(os.Environ(), agent.GoMaxProcsEnv+"=1", "GODEBUG=schedtrace=20")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	procs := make(chan string, 1)
	go func() {
		listening := false
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.Contains(line, "agent listening"):
				listening = true
			case listening && strings.HasPrefix(line, "SCHED"):
				for _, f := range strings.Fields(line) {
					if v, ok := strings.CutPrefix(f, "gomaxprocs="); ok {
						procs <- v
						return
					}
				}
			}
		}
		close(procs)
	}()
	select {
	case v, ok := <-procs:
		if !ok {
			t.Fatal("the agent ended before its scheduler trace said how many threads run its goroutines")
		}
		if v != "1" {
			t.Fatalf("the serving agent's gomaxprocs=%s, want 1", v)
		}
	case <-ctx.Done():
		t.Fatal("no scheduler trace from the serving agent")
	}
	c := agent.NewClient(sock)
	res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"env"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || strings.Contains(res.Stdout, agent.GoMaxProcsEnv) {
		t.Fatalf("exit %d; the command's environment:\n%s", res.ExitCode, res.Stdout)
	}
}
