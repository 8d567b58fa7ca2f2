package agent

import (
	"os"
	"strings"
)

// endAllAsInit ends every process of the guest but the agent where the agent is the guest's
// init, PID 1 of its PID namespace, and keeps no pids cgroup of its own (a runc guest: its
// processes are host processes, held by the host's limit, which is the guest's): kill(-1)
// from PID 1 signals every process of the namespace but the caller, in rounds (killAll) until
// /proc lists the agent alone. The node asks when the host's guests near their process total
// and this guest holds the most: ending them gives the host its tasks back. ok is false where
// the agent is not PID 1, and cannot tell the guest's processes from others.
func endAllAsInit() (n int, ok bool) {
	if os.Getpid() != 1 {
		return 0, false
	}
	return killAll(countProcs, 1), true
}

// countProcs counts the processes /proc lists (thread group leaders, zombies until reaped).
func countProcs() (int, error) {
	f, err := os.Open("/proc")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range names {
		if strings.Trim(name, "0123456789") == "" {
			n++
		}
	}
	return n, nil
}
