package oci

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"wb/hypervisor"
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

// thaw thaws cgroupsPath p's freezer as `runc resume` does (v1: freezer.state THAWED; v2:
// cgroup.freeze 0), and reports whether the cgroup reads thawed after. runc reads a
// container's paused state from the same file, so it sees the thaw.
func (h cgroupHost) thaw(p string) bool {
	file, value := filepath.Join(h.v2Root, p, "cgroup.freeze"), "0"
	if !h.v2 {
		if h.v1["freezer"] == "" {
			return false
		}
		file, value = filepath.Join(h.v1["freezer"], p, "freezer.state"), "THAWED"
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return false
	}
	_, werr := f.WriteString(value)
	if err := f.Close(); werr != nil || err != nil {
		return false
	}
	b, err := os.ReadFile(file)
	return err == nil && strings.TrimSpace(string(b)) == value
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

// limitsReport names the guest cgroup's process and memory counters against their limits,
// with how often each limit refused (pids.events max, memory failcnt), for a log line.
// Counters it cannot read are left out.
func (h cgroupHost) limitsReport(p string) string {
	var pids, mem string
	if h.v2 {
		pids, mem = filepath.Join(h.v2Root, p), filepath.Join(h.v2Root, p)
	} else {
		pids, mem = filepath.Join(h.v1["pids"], p), filepath.Join(h.v1["memory"], p)
	}
	files := []string{filepath.Join(pids, "pids.current"), filepath.Join(pids, "pids.max"), filepath.Join(pids, "pids.events")}
	if h.v2 {
		files = append(files, filepath.Join(mem, "memory.current"), filepath.Join(mem, "memory.max"), filepath.Join(mem, "memory.events"))
	} else {
		files = append(files, filepath.Join(mem, "memory.usage_in_bytes"), filepath.Join(mem, "memory.max_usage_in_bytes"),
			filepath.Join(mem, "memory.limit_in_bytes"), filepath.Join(mem, "memory.failcnt"), filepath.Join(mem, "memory.oom_control"))
	}
	var parts []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			parts = append(parts, filepath.Base(f)+"="+strings.Join(strings.Fields(string(b)), " "))
		}
	}
	if len(parts) == 0 {
		return "cgroup " + p + ": gone"
	}
	return "cgroup " + p + ": " + strings.Join(parts, ", ")
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

// emptyWithin waits up to wait for cgroupsPath p to hold no process in any hierarchy (a
// missing cgroup holds none), and reports whether it came to. Every hierarchy is looked at:
// on cgroup v1 runsc leaves out those it does not know (a hybrid host's cgroup2 tree, which
// systemd's hosts list first), so the first one alone can say empty while the sandbox's last
// processes still run in the others.
func (h cgroupHost) emptyWithin(ctx context.Context, p string, wait time.Duration) bool {
	busy := h.dirs(p)
	// From 5 ms, twice as long each time up to 200 ms: on a loaded host the last processes
	// take a second or more, and a look every 10 ms cost this process more than it saved.
	pause := 5 * time.Millisecond
	for deadline := time.Now().Add(wait); ; pause = min(2*pause, 200*time.Millisecond) {
		// A cgroup seen empty stays so: the dead sandbox's processes only leave.
		busy = slices.DeleteFunc(busy, func(d string) bool {
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			return errors.Is(err, fs.ErrNotExist) || err == nil && len(bytes.TrimSpace(b)) == 0
		})
		if len(busy) == 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(min(pause, time.Until(deadline)+time.Millisecond))
	}
}

// removeDirs removes a guest's leftover cgroup directories (runsc leaves them when its
// sandbox was killed; a runc guest deleted without runc leaves them all). Missing ones are
// fine. A dir still busy (its last processes still exiting after their init's death) is
// tried again, 5 times in all over some 150 ms, as runc's own delete does.
func (h cgroupHost) removeDirs(p string) error {
	dirs := h.dirs(p)
	var errs []error
	wait := 10 * time.Millisecond
	for i := range 5 {
		if i > 0 {
			time.Sleep(wait)
			wait *= 2
		}
		errs = errs[:0]
		busy := dirs[:0]
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
				busy = append(busy, d)
			}
		}
		if dirs = busy; len(dirs) == 0 {
			return nil
		}
	}
	return errors.Join(errs...)
}

// Process limits of a guest.
//
// A runc guest's processes are host processes: the pids cgroup's limit is Spec.Pids, and the
// agent (PID 1, which keeps spare threads) outlives a guest that reaches it.
//
// A runsc guest on the ptrace platform costs the host far more than one task per process:
// every guest address space is a host stub process with one thread per sentry thread that
// ever ran it, and the sentry itself needs about 60. Measured on runsc 20221219: a fork bomb
// held to 256–512 guest processes grows the sandbox by ~300–600 host tasks a second, on and
// on (toward guest processes × sentry threads, past 10k); without a guest limit it reaches
// any host limit within seconds, and the sandbox dies when it does. So the guest gets a
// limit of its own inside gVisor (the agent puts every exec and PTY process in a pids cgroup
// of gVisor's cgroupfs, which it needs CAP_SYS_ADMIN to mount and then drops), well below
// the sandbox's host limit, and the agent ends the guest's processes when they stay at that
// limit for a second (agent.Config.PidsMax). At 512 the bomb's churn starved the agent of
// CPU long enough for the sandbox to die first; at 256 the agent ended it after 4 s. A bomb
// that stays below the guest's limit is not seen there, so the event watch also reads the
// sandbox's own count, and the node has the agent end the guest's processes at half the
// host limit (sandboxPids).
const (
	runscPidsBase    = 128
	runscPidsPerProc = 12
	// runscHostPidsMin is the least host limit of a runsc sandbox: the host tasks grow with
	// time under a fork bomb whatever the guest's own limit, so a small guest limit does not
	// make a small host limit safe.
	runscHostPidsMin = 8192
	// runscGuestPidsMax caps the guest's own limit under runsc.
	runscGuestPidsMax = 256
	// runscMiBPerProc and runscGuestPidsMin size the guest's own limit to its memory.
	runscMiBPerProc   = 4
	runscGuestPidsMin = 32
	// agentPidsMaxEnv is agent.PidsMaxEnv (a test checks they agree): how the agent learns
	// the guest's own process limit.
	agentPidsMaxEnv = "WB_AGENT_PIDS_MAX"
)

// agentGoMaxProcsEnv is agent.GoMaxProcsEnv (a test checks they agree): how a runsc guest's
// agent learns to run Go's scheduler on one thread (agentProcsProcess).
const agentGoMaxProcsEnv = "WB_AGENT_GOMAXPROCS"

// agentProcsProcess has a runsc guest's agent run its goroutines on one thread at a time.
// Under gVisor's ptrace platform each of the agent's threads that wakes to look for work
// costs trapped system calls (futex, clock_gettime, epoll) and a host context switch, and
// with a second P the Go scheduler woke one for nearly every goroutine made runnable: the
// agent's share of an exec's answer fell from 2.7 to 2.3 ms (p50, same run, alternated), the
// whole exec overhead from 5.6 to 5.1 ms. The agent's work is waiting on the guest's
// processes, not computing; blocking system calls still get threads of their own.
func agentProcsProcess(p *specs.Process) {
	if runsAgent(p) {
		p.Env = append(p.Env, agentGoMaxProcsEnv+"=1")
	}
}

// runsAgent answers whether p, a guest's init, is wb's agent (`wb agent …` from the bind
// mount the driver makes), not another init that must not get what the agent is given.
func runsAgent(p *specs.Process) bool {
	return len(p.Args) >= 2 && p.Args[0] == hypervisor.GuestAgentBin && p.Args[1] == "agent"
}

// pidsLimits returns the host pids cgroup limit of a guest allowed pids processes in
// memoryMiB (0: unlimited), and the limit the agent enforces inside the guest (0: none, the
// host's is the guest's).
func pidsLimits(pids, memoryMiB int, runsc bool) (host, guest int64) {
	if pids <= 0 {
		return 0, 0
	}
	if !runsc {
		return int64(pids), 0
	}
	guest = int64(min(pids, runscGuestPidsMax))
	if memoryMiB > 0 {
		// Each guest process and its host threads cost the sandbox memory too: a bomb of 256
		// in 256 MiB ran the sandbox out of memory before the agent could end it.
		guest = min(guest, max(int64(memoryMiB/runscMiBPerProc), runscGuestPidsMin))
	}
	return max(runscPidsBase+int64(pids)*runscPidsPerProc, runscHostPidsMin), guest
}

// guestLimitsProcess gives the agent what it needs to enforce an in-guest process limit:
// the limit in its environment, CAP_SYS_ADMIN to mount gVisor's cgroupfs, and CAP_SETPCAP to
// drop CAP_SYS_ADMIN from its bounding set, which it does on every thread before it serves,
// so no guest process ever holds CAP_SYS_ADMIN. (CAP_SETPCAP stays, as in Docker's default
// set: it only lets a process give up capabilities.) Only an init that is the agent gets
// them: another init would keep CAP_SYS_ADMIN.
func guestLimitsProcess(p *specs.Process, guestPids int64) {
	if guestPids <= 0 || !runsAgent(p) {
		return
	}
	p.Env = append(p.Env, fmt.Sprintf("%s=%d", agentPidsMaxEnv, guestPids))
	for _, set := range []*[]string{&p.Capabilities.Bounding, &p.Capabilities.Effective, &p.Capabilities.Permitted} {
		for _, c := range []string{"CAP_SYS_ADMIN", "CAP_SETPCAP"} {
			if !slices.Contains(*set, c) {
				*set = append(slices.Clone(*set), c)
			}
		}
	}
}
