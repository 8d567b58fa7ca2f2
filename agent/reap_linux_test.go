package agent

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestReap makes the test process a child subreaper, as PID 1 is, so that orphans come to it.
// It is not parallel: the reaper must be the only one collecting children while it runs.
func TestReap(t *testing.T) {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, 36 /* PR_SET_CHILD_SUBREAPER */, 1, 0); errno != 0 {
		t.Skipf("cannot become a subreaper: %v", errno)
	}
	defer syscall.RawSyscall(syscall.SYS_PRCTL, 36, 0, 0)
	c, _ := startAgent(t, true)
	ctx := testCtx(t, 60*time.Second)
	me := os.Getpid()

	// Orphans: the shell exits at once, its background sleep is reparented to us and exits soon.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			code := i % 7
			res, err := c.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("(sleep 0.1 >/dev/null 2>&1 &); exit %d", code)}}, nil)
			if err != nil || res.ExitCode != code {
				t.Errorf("exec %d: %+v %v (an exit status was stolen?)", i, res, err)
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(15 * time.Second)
	for {
		zombies := procs(func(st byte, ppid, _ int) bool { return ppid == me && st == 'Z' })
		live := procs(func(st byte, ppid, _ int) bool { return ppid == me && st != 'Z' })
		if len(zombies) == 0 && len(live) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("children left: zombies %v, live %v", zombies, live)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
