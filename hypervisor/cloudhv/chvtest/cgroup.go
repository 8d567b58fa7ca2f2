package chvtest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cgroupRoot is where the host's cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// nestCgroup answers the cgroup below which the guest's goes so that it is accounted to
// this process's: on v1 the cgroup this process has in the cpuacct and memory hierarchies
// (the two must agree, as the cloudhv driver makes them; else "/" with a warning). On v2
// this process's cgroup must hold no process once it has children with controllers (the
// "no internal processes" rule), so the VMM moves itself into <own>/vmm first.
func nestCgroup(log *slog.Logger) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("chvtest: own cgroup: %w", err)
	}
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		own, ok := cgroupOf(string(b), "")
		if !ok {
			return "", errors.New("chvtest: /proc/self/cgroup has no cgroup v2 line (0::<path>)")
		}
		if own == "/" {
			return "/", nil // the root may hold processes
		}
		vmm := filepath.Join(cgroupRoot, own, "vmm")
		if err := os.MkdirAll(vmm, 0o755); err != nil {
			return "", fmt.Errorf("chvtest: nest the guest's cgroup: %w", err)
		}
		if err := os.WriteFile(filepath.Join(vmm, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return "", fmt.Errorf("chvtest: move the VMM into %s: %w", vmm, err)
		}
		return own, nil
	}
	cpu, okc := cgroupOf(string(b), "cpuacct")
	mem, okm := cgroupOf(string(b), "memory")
	if !okc || !okm || cpu != mem {
		log.Warn("the VMM's cpuacct and memory cgroups differ: its guest's cgroup is not nested below them, so the guest's CPU and memory are not counted as the VMM's",
			"cpuacct", cpu, "memory", mem)
		return "/", nil
	}
	return cpu, nil
}

// cgroupOf finds the path of controller's hierarchy (v1: "N:a,b:path") or, for "", the v2
// line ("0::path") in the text of /proc/<pid>/cgroup.
func cgroupOf(procCgroup, controller string) (string, bool) {
	for line := range strings.SplitSeq(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if controller == "" && f[0] == "0" && f[1] == "" {
			return f[2], true
		}
		for _, c := range strings.Split(f[1], ",") {
			if controller != "" && c == controller {
				return f[2], true
			}
		}
	}
	return "", false
}
