// Package proc reads host processes from /proc. It identifies them across pid reuse: a pid
// together with its start time names one process, which the guest drivers use to follow a
// sandbox or a VMM they started (possibly before a restart of the node). And it reads the
// CPU time a process and the whole host spent, which the benchmarks split a run's cost by.
package proc

import (
	"fmt"
	"os"
	"strings"
)

// Start returns the start time (field 22 of /proc/<pid>/stat) of a live process; false for a
// process that is gone or a zombie.
func Start(pid int) (string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	f, ok := statFields(string(b))
	// f[0] is field 3 (state); field 22 is f[19].
	if !ok || len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return "", false
	}
	return f[19], true
}

// statFields answers the fields of a /proc/<pid>/stat line from field 3 on. The command
// name, field 2, is in parentheses and may hold spaces and parentheses of its own: the fields
// after it follow the last ')'.
func statFields(stat string) ([]string, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(stat[i+1:]), true
}

// Alive reports whether pid still runs and is the process that started at start (any
// process with that pid when start is empty).
func Alive(pid int, start string) bool {
	s, ok := Start(pid)
	return ok && (start == "" || s == start)
}
