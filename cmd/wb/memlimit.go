package main

import (
	"bufio"
	"bytes"
	"math"
	"strconv"
	"strings"
)

// memoryLimit answers the Go soft memory limit for wb unless $GOMEMLIMIT is set (then 0):
// three quarters of the cgroup's memory limit when wb runs in one, else a quarter of the
// machine's memory (which it shares with Redis and the guests).
//
// Why: wb runs with GOGC 400 (see gcPercent), so the heap may grow to five times what is
// live before the collector runs. A burst (many decisions at once, a large upload) could
// then take the machine's or the cgroup's memory and get wb killed, and the embedded Redis
// with it. With a soft limit the collector works harder as the heap nears it instead; it
// never refuses memory, it only collects sooner.
func memoryLimit(getenv func(string) string, readFile func(string) ([]byte, error)) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return 0
	}
	var machine int64
	if b, err := readFile("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if err == nil {
					machine = kb << 10
				}
			}
		}
	}
	cgroup := int64(math.MaxInt64)
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		if b, err := readFile(f); err == nil {
			if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 {
				cgroup = min(cgroup, n) // "max" (no limit) does not parse
			}
		}
	}
	switch {
	case cgroup < math.MaxInt64 && (machine == 0 || cgroup < machine):
		return cgroup / 4 * 3
	case machine > 0:
		return machine / 4
	}
	return 0
}
