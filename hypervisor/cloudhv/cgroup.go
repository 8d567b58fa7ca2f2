package cloudhv

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// cgroups is where each VMM's cgroup lives: on a v2 host one directory per VMM, on a v1 host
// one per VMM in the cpuacct and memory hierarchies (all the driver reads). What the VMM
// makes below its cgroup (the fake VMM's runc guest does, in every v1 hierarchy) is the
// VMM's: killed and removed with it.
type cgroups struct {
	v2Root  string   // v2 mount point; "" on v1
	cpuacct string   // v1 mount points
	memory  string   //
	v1All   []string // every v1 hierarchy's mount point, for removal
}

// detectCgroups reads the host's layout (as hypervisor/oci does: v2 when cgroup.controllers
// is at the root, else the v1 hierarchies from mountinfo).
func detectCgroups(mountinfo, unifiedProbe string) (cgroups, error) {
	var c cgroups
	if _, err := os.Stat(unifiedProbe); err == nil {
		c.v2Root = filepath.Dir(unifiedProbe)
		return c, nil
	}
	f, err := os.Open(mountinfo)
	if err != nil {
		return c, fmt.Errorf("cloudhv: cgroups: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || pf[3] != "/" {
			continue
		}
		if qf[0] == "cgroup2" { // a hybrid host's controller-less tree: runc makes dirs there too
			c.v1All = append(c.v1All, pf[4])
			continue
		}
		if qf[0] != "cgroup" {
			continue
		}
		c.v1All = append(c.v1All, pf[4])
		for _, opt := range strings.Split(qf[2], ",") {
			switch {
			case opt == "cpuacct" && c.cpuacct == "":
				c.cpuacct = pf[4]
			case opt == "memory" && c.memory == "":
				c.memory = pf[4]
			}
		}
	}
	if c.cpuacct == "" || c.memory == "" {
		return c, errors.New("cloudhv: no cgroup v2 and no v1 cpuacct and memory hierarchies mounted: the driver puts each VMM in a cgroup to account its CPU and memory")
	}
	return c, nil
}

func (c cgroups) dirs(p string) []string {
	if c.v2Root != "" {
		return []string{filepath.Join(c.v2Root, p)}
	}
	return []string{filepath.Join(c.cpuacct, p), filepath.Join(c.memory, p)}
}

// create makes cgroup p (on v2, enabling the cpu and memory controllers below its parent
// where the host allows).
func (c cgroups) create(p string) error {
	if c.v2Root != "" {
		parent := filepath.Join(c.v2Root, filepath.Dir(p))
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("cloudhv: cgroup: %w", err)
		}
		// Each ancestor, from the root down, hands the cpu and memory controllers on.
		rel := strings.Split(strings.Trim(filepath.Dir(p), "/"), "/")
		dir := c.v2Root
		for _, part := range append([]string{""}, rel...) {
			dir = filepath.Join(dir, part)
			_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu +memory"), 0)
		}
	}
	for _, d := range c.dirs(p) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cloudhv: cgroup: %w", err)
		}
	}
	return nil
}

// add moves process pid (all its threads) into cgroup p.
func (c cgroups) add(p string, pid int) error {
	for _, d := range c.dirs(p) {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("cloudhv: put the VMM in cgroup %s: %w", d, err)
		}
	}
	return nil
}

// tree lists cgroup dir and the cgroups below it, deepest first (a missing dir: none).
func tree(dir string) []string {
	var out []string
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, tree(filepath.Join(dir, e.Name()))...)
		}
	}
	return append(out, dir)
}

// pids lists the processes in cgroup p and below it.
func (c cgroups) pids(p string) []int {
	var out []int
	for _, d := range c.dirs(p) {
		for _, sub := range tree(d) {
			b, err := os.ReadFile(filepath.Join(sub, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
					out = append(out, pid)
				}
			}
		}
	}
	return out
}

// killAll SIGKILLs every process left in cgroup p or below it.
func (c cgroups) killAll(p string) {
	for _, pid := range c.pids(p) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// remove removes cgroup p and the cgroups below it, in every hierarchy; missing ones are fine.
func (c cgroups) remove(p string) error {
	roots := []string{c.v2Root}
	if c.v2Root == "" {
		roots = c.v1All
	}
	var errs []error
	for _, root := range roots {
		for _, d := range tree(filepath.Join(root, p)) {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// counters reads cgroup p's CPU time, memory use and OOM kills.
func (c cgroups) counters(p string) (cpuNanos, memBytes, oomKills int64, err error) {
	if c.v2Root != "" {
		dir := filepath.Join(c.v2Root, p)
		usec, err := readKeyed(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return 0, 0, 0, err
		}
		mem, _ := readInt(filepath.Join(dir, "memory.current"))
		ooms, _ := readKeyed(filepath.Join(dir, "memory.events"), "oom_kill")
		return usec * 1000, mem, ooms, nil
	}
	if cpuNanos, err = readInt(filepath.Join(c.cpuacct, p, "cpuacct.usage")); err != nil {
		return 0, 0, 0, err
	}
	if memBytes, err = readInt(filepath.Join(c.memory, p, "memory.usage_in_bytes")); err != nil {
		return 0, 0, 0, err
	}
	oomKills, _ = readKeyed(filepath.Join(c.memory, p, "memory.oom_control"), "oom_kill")
	return cpuNanos, memBytes, oomKills, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cloudhv: parse %s: %w", path, err)
	}
	return n, nil
}

func readKeyed(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("cloudhv: %s has no %s", path, key)
}
