package oci

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// cgroupHost describes the host's cgroup layout: v2 (unified) or v1 (per-controller
// hierarchies, possibly hybrid with a controller-less cgroup2 beside them).
type cgroupHost struct {
	v2     bool
	v2Root string            // v2 mount point
	v1     map[string]string // v1 controller → mount point
	v1All  []string          // every hierarchy's mount point (also name=systemd and the hybrid cgroup2 tree)
	swap   bool              // swap accounting available
}

// detectCgroups reads the host's layout. unifiedProbe is the file whose presence means v2
// (normally /sys/fs/cgroup/cgroup.controllers).
func detectCgroups(mountinfo, unifiedProbe string) (cgroupHost, error) {
	h := cgroupHost{v1: map[string]string{}}
	if _, err := os.Stat(unifiedProbe); err == nil {
		h.v2 = true
		h.v2Root = filepath.Dir(unifiedProbe)
		// runc writes memory.swap.max = swap - limit = 0 and ignores a host without swap
		// accounting.
		h.swap = true
		return h, nil
	}
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		return h, fmt.Errorf("oci: read %s: %w", mountinfo, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// 36 35 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || (qf[0] != "cgroup" && qf[0] != "cgroup2") || pf[3] != "/" {
			continue
		}
		if !slices.Contains(h.v1All, pf[4]) {
			h.v1All = append(h.v1All, pf[4])
		}
		if qf[0] == "cgroup2" {
			continue // hybrid: runc also places guests in the controller-less unified tree
		}
		for _, opt := range strings.Split(qf[2], ",") {
			switch opt {
			case "cpu", "cpuacct", "memory", "pids", "freezer", "cpuset", "blkio", "devices":
				if _, dup := h.v1[opt]; !dup {
					h.v1[opt] = pf[4]
				}
			}
		}
	}
	if h.v1["memory"] == "" || h.v1["cpuacct"] == "" {
		return h, errors.New("oci: no cgroup v2 and no v1 memory/cpuacct hierarchy mounted")
	}
	_, err = os.Stat(filepath.Join(h.v1["memory"], "memory.memsw.limit_in_bytes"))
	h.swap = err == nil
	return h, nil
}

// dirs lists the cgroup directories a guest with cgroupsPath p owns.
func (h cgroupHost) dirs(p string) []string {
	if h.v2 {
		return []string{filepath.Join(h.v2Root, p)}
	}
	out := make([]string, 0, len(h.v1All))
	for _, mp := range h.v1All {
		out = append(out, filepath.Join(mp, p))
	}
	return out
}

// cgroupStats are the raw counters of one guest cgroup.
type cgroupStats struct {
	cpuNanos    int64
	memoryBytes int64
	oomKills    int64
}

// read returns the counters of cgroupsPath p; fs.ErrNotExist when the cgroup is gone.
func (h cgroupHost) read(p string) (cgroupStats, error) {
	var st cgroupStats
	if h.v2 {
		dir := filepath.Join(h.v2Root, p)
		cpu, err := readKeyed(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return st, err
		}
		st.cpuNanos = cpu * 1000
		if st.memoryBytes, err = readInt(filepath.Join(dir, "memory.current")); err != nil {
			return st, err
		}
		if st.oomKills, err = readKeyed(filepath.Join(dir, "memory.events"), "oom_kill"); err != nil {
			return st, err
		}
		return st, nil
	}
	var err error
	if st.cpuNanos, err = readInt(filepath.Join(h.v1["cpuacct"], p, "cpuacct.usage")); err != nil {
		return st, err
	}
	mem := filepath.Join(h.v1["memory"], p)
	if st.memoryBytes, err = readInt(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return st, err
	}
	// oom_kill is in memory.oom_control since Linux 4.13; older kernels only say whether the
	// limit was ever hit (failcnt), which is the closest thing.
	st.oomKills, err = readKeyed(filepath.Join(mem, "memory.oom_control"), "oom_kill")
	if errors.Is(err, errNoKey) {
		fail, ferr := readInt(filepath.Join(mem, "memory.failcnt"))
		if ferr != nil {
			return st, ferr
		}
		st.oomKills, err = min(fail, 1), nil
	}
	return st, err
}

// oomKills reads only the OOM counter (cheap enough to poll).
func (h cgroupHost) oomKills(p string) (int64, error) {
	if h.v2 {
		return readKeyed(filepath.Join(h.v2Root, p, "memory.events"), "oom_kill")
	}
	return readKeyed(filepath.Join(h.v1["memory"], p, "memory.oom_control"), "oom_kill")
}

var errNoKey = errors.New("key not found")

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("oci: parse %s: %w", path, err)
	}
	return n, nil
}

// readKeyed reads "key value" lines (cpu.stat, memory.events, memory.oom_control).
func readKeyed(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("oci: parse %s %s: %w", path, key, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("oci: %s has no %q: %w", path, key, errNoKey)
}

// removeDirs removes a guest's leftover cgroup directories (runsc leaves them when its
// sandbox was killed). Missing ones are fine.
func (h cgroupHost) removeDirs(p string) error {
	var errs []error
	for _, d := range h.dirs(p) {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
