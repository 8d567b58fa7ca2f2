package agent

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
)

// A command refused for the guest's process limit says so, and what to do.
func TestStartErrorAtProcessLimit(t *testing.T) {
	got := startError("sh", fmt.Errorf("fork/exec /bin/sh: %w", syscall.EAGAIN))
	if !strings.Contains(got, "the guest is at its process limit") || !strings.Contains(got, "try again") {
		t.Errorf("EAGAIN: %q", got)
	}
	if got := startError("sh", errors.New("exec format error")); strings.Contains(got, "process limit") {
		t.Errorf("another error blamed on the process limit: %q", got)
	}
}

// spareThreads returns once the threads exist, and a nil cgroup starts children in place.
func TestSpareThreadsAndNoCgroup(t *testing.T) {
	spareThreads(4)
	var cg *childCgroup
	pid, err := cg.startIn(func() (int, error) { return 42, nil })
	if pid != 42 || err != nil {
		t.Fatalf("startIn without a cgroup = %d, %v", pid, err)
	}
	if setupChildCgroup(t.Context(), nil, 0, true) != nil {
		t.Fatal("a cgroup without a limit")
	}
}

// TestSpareThreadsFor: the agent keeps spare threads only where the guest's processes share
// its limit; with a work cgroup of their own (runsc) it makes none, a third of its start
// under gVisor's ptrace platform.
func TestSpareThreadsFor(t *testing.T) {
	if n := spareThreadsFor(nil); n != spareOSThreads {
		t.Errorf("no work cgroup: %d spare threads, want %d", n, spareOSThreads)
	}
	if n := spareThreadsFor(&childCgroup{work: "/sys/fs/cgroup/wb-work", max: 256}); n != 0 {
		t.Errorf("a work cgroup: %d spare threads, want none", n)
	}
}
