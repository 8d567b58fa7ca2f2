package proc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// tick is the unit of /proc's CPU times (USER_HZ): the kernel reports them to user space in
// hundredths of a second on every architecture, whatever its own tick.
const tick = 10 * time.Millisecond

// HostBusy answers how long the host's CPUs have been busy since boot, all of them together:
// /proc/stat's user, nice, system, irq and softirq time. Not idle, nor iowait (idle time
// with I/O outstanding), nor steal (the hypervisor running others).
func HostBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseHostBusy(string(b))
}

func parseHostBusy(stat string) (time.Duration, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("proc: /proc/stat does not begin with the CPUs' total: %.80q", line)
	}
	// f[1..]: user nice system idle iowait irq softirq steal …
	return sumTicks(f, "/proc/stat's cpu", 1, 2, 3, 6, 7)
}

// CPU answers the user and system CPU time of process pid (all its threads) and that of its
// children it has waited for (fields 14 to 17 of /proc/<pid>/stat).
func CPU(pid int) (self, children time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseCPU(string(b))
}

func parseCPU(stat string) (self, children time.Duration, err error) {
	f, ok := statFields(stat) // f[0] is field 3
	if !ok {
		return 0, 0, errors.New("proc: a stat line with no command name")
	}
	if self, err = sumTicks(f, "stat", 11, 12); err != nil {
		return 0, 0, err
	}
	if children, err = sumTicks(f, "stat", 13, 14); err != nil {
		return 0, 0, err
	}
	return self, children, nil
}

// sumTicks answers the sum of the tick counts f[at...], of the file what.
func sumTicks(f []string, what string, at ...int) (time.Duration, error) {
	var sum time.Duration
	for _, i := range at {
		if i >= len(f) {
			return 0, fmt.Errorf("proc: %s has %d fields, not %d", what, len(f), i+1)
		}
		// A count of ticks past this bound would overflow a Duration: no host runs that long.
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || v < 0 || v > int64(1<<62)/int64(tick) {
			return 0, fmt.Errorf("proc: %s field %d is not a count of ticks: %.40q", what, i, f[i])
		}
		sum += time.Duration(v) * tick
	}
	return sum, nil
}
