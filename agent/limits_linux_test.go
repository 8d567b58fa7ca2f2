package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// TestCounterRereads: the guard's reader of pids.current keeps the file open and answers what
// it holds at each read, not what it held at the first.
func TestCounterRereads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pids.current")
	if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	count := (&childCgroup{current: f}).counter()
	for _, want := range []int{5, 12, 3} {
		if err := os.WriteFile(path, []byte(strconv.Itoa(want)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := count(); got != want || err != nil {
			t.Errorf("count after writing %d: %d, %v", want, got, err)
		}
	}
}

// TestSpawnerForksFromItsThread: every startFn runs on the one OS thread the spawner moved
// (entered) at its start, whichever goroutine asks; a spawner that cannot move its thread
// answers why; once its context ends, a start is refused, not left waiting.
func TestSpawnerForksFromItsThread(t *testing.T) {
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var moved int
	spawn, done, err := startSpawner(ctx, func(tid int) error { moved = tid; return nil })
	if err != nil {
		t.Fatal(err)
	}
	c := &childCgroup{spawn: spawn, done: done}
	var wg sync.WaitGroup
	tids := make([]int, 64)
	for i := range tids {
		wg.Go(func() {
			runtime.LockOSThread() // a thread of the caller's own: the start must not run here
			defer runtime.UnlockOSThread()
			pid, err := c.startIn(func() (int, error) { tids[i] = syscall.Gettid(); return i, nil })
			if pid != i || err != nil {
				t.Errorf("start %d: %d, %v", i, pid, err)
			}
		})
	}
	wg.Wait()
	for i, tid := range tids {
		if tid != moved {
			t.Fatalf("start %d ran on thread %d, not on the spawner's %d, which was moved", i, tid, moved)
		}
	}
	// While the guard ends every process, a start is refused as at the limit, not run into
	// its kill rounds.
	c.ending.Store(true)
	if _, err := c.startIn(func() (int, error) { t.Error("a start ran while the guard ended every process"); return 0, nil }); !errors.Is(err, syscall.EAGAIN) {
		t.Errorf("a start while the guard ends every process: %v, want EAGAIN", err)
	} else if msg := startError("sh", err); !strings.Contains(msg, "process limit") || !strings.Contains(msg, "sandbox's host task limit") {
		// The node ends them too (POST /v1/procs/end), for the sandbox's host tasks.
		t.Errorf("its message: %q", msg)
	}
	c.ending.Store(false)
	stop()
	<-done
	if _, err := c.startIn(func() (int, error) { t.Error("a start ran after the spawner ended"); return 0, nil }); err == nil {
		t.Error("a start after the spawner ended: no error")
	}

	refused := errors.New("no room")
	if _, _, err := startSpawner(t.Context(), func(int) error { return refused }); !errors.Is(err, refused) {
		t.Errorf("a spawner that could not move its thread: %v, want %v", err, refused)
	}
}

// TestPidsHierarchyMount: a pids hierarchy mounted anywhere is found (the agent's own mount
// would be the same hierarchy, reachable there), and nothing else is taken for one.
func TestPidsHierarchyMount(t *testing.T) {
	for _, c := range []struct {
		mountinfo, want string
	}{
		{"30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n", ""},
		{"31 30 0:28 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids\n", "/sys/fs/cgroup/pids"},
		{"40 1 0:30 / /elsewhere rw shared:5 - cgroup none rw,cpu,pids,memory\n", "/elsewhere"},
		{"41 1 0:31 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n", ""},
		{"42 1 0:32 / /pids rw - tmpfs pids rw,pids\n", ""},
		{"garbage\n - \n", ""},
	} {
		at, ok := pidsHierarchyMount([]byte(c.mountinfo))
		if at != c.want || ok != (c.want != "") {
			t.Errorf("%q: %q, %v; want %q", c.mountinfo, at, ok, c.want)
		}
	}
}
