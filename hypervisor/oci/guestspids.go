package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The guests' process total.
//
// Each guest has a host pids limit of its own (pidsLimits), but nothing bounded their sum:
// with kernel.pid_max at 32768, 32 runc guests at Spec.Pids 1024 (or 3 runsc sandboxes at
// 12,416 host tasks) running fork bombs took every process id of the host, and then the
// platform's own processes there (redis-server, every node's runc and runsc for the other
// tenants, sshd) could not fork: one tenant took the host down for all. As Kubernetes
// reserves process ids for the system's daemons (--system-reserved=pid, enforced on the
// kubepods cgroup), the driver caps the cgroup every guest on the host is under
// (Options.GuestsCgroup, wb's /wb) at the host's task limit less a reserve. The pids
// controller is hierarchical, so each guest's own limit still holds below the total.
const (
	// pidsReserveMin is the least reserve: the tasks a host runs outside its guests are
	// per-CPU kernel threads (some 8 per CPU: over 1000 on a 128-CPU host), the system's
	// daemons and redis-server, each node's Go threads (tens to a few hundred), and the runc
	// and runsc commands of the starts under way (a Go runtime each, 10–20 threads; runc's
	// init is the guest's). The 2-CPU build host runs some 120 tasks outside guests; 4096 is
	// that of a large host several times over.
	pidsReserveMin = 4096
	// pidsReserveDiv: on a host whose limit is large (systemd raises pid_max to 4194304 on
	// 64-bit hosts; threads-max grows with memory) the reserve is an eighth, since the
	// platform's tasks grow with the host's CPUs and guests as its limits do.
	pidsReserveDiv = 8
)

// guestsPidsMax is the guests' total of host tasks on a host that allows hostTasks:
// hostTasks less max(4096, an eighth), and at least half of hostTasks on a host too small
// for that reserve.
func guestsPidsMax(hostTasks int64) int64 {
	return hostTasks - min(max(pidsReserveMin, hostTasks/pidsReserveDiv), hostTasks/2)
}

// hostTasks is how many tasks the host can hold: the smaller of kernel.pid_max (every
// thread takes a process id) and kernel.threads-max (the kernel's own task limit, sized to
// its memory).
func hostTasks(pidMaxFile, threadsMaxFile string) (int64, error) {
	var n []int64
	for _, f := range []string{pidMaxFile, threadsMaxFile} {
		v, err := readInt(f)
		if err != nil {
			return 0, err
		}
		if v <= 0 {
			return 0, fmt.Errorf("oci: %s holds %d, not a task limit", f, v)
		}
		n = append(n, v)
	}
	return slices.Min(n), nil
}

// capPids lowers cgroup p's pids.max to limit, and keeps a value already there that is no
// higher (an operator's, or another node's on this host: each computes the same; a node of
// an older release beside it sets none, and its guests, below p too, count). A lower value
// cannot be told from one a node computed before pid_max was raised: after raising it, the
// operator writes max there and restarts a node. It creates p, on v2 enabling the pids
// controller in its ancestors as runc would, and returns the limit p has after it and
// whether that was there before.
func (h cgroupHost) capPids(p string, limit int64) (got int64, kept bool, err error) {
	if h.v2 {
		dir := h.v2Root
		for part := range strings.SplitSeq(strings.Trim(filepath.Clean(p), "/"), "/") {
			if err := enablePids(dir); err != nil {
				return 0, false, err
			}
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return 0, false, fmt.Errorf("oci: %w", err)
			}
		}
	} else {
		if h.v1["pids"] == "" {
			return 0, false, errors.New("oci: no v1 pids hierarchy mounted")
		}
		if err := os.MkdirAll(h.pidsDir(p), 0o755); err != nil {
			return 0, false, fmt.Errorf("oci: %w", err)
		}
	}
	file := filepath.Join(h.pidsDir(p), "pids.max")
	cur, err := readInt(file) // -1: max
	if err != nil {
		return 0, false, fmt.Errorf("oci: %w", err)
	}
	if cur >= 0 && cur <= limit {
		return cur, true, nil
	}
	if err := os.WriteFile(file, []byte(fmt.Sprint(limit)), 0o644); err != nil {
		return 0, false, fmt.Errorf("oci: %w", err)
	}
	return limit, false, nil
}

// pidsDir is cgroup p's directory in the pids hierarchy.
func (h cgroupHost) pidsDir(p string) string {
	if h.v2 {
		return filepath.Join(h.v2Root, p)
	}
	return filepath.Join(h.v1["pids"], p)
}

// enablePids enables the pids controller for v2 cgroup dir's children.
func enablePids(dir string) error {
	file := filepath.Join(dir, "cgroup.subtree_control")
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	if slices.Contains(strings.Fields(string(b)), "pids") {
		return nil
	}
	if err := os.WriteFile(file, []byte("+pids"), 0o644); err != nil {
		return fmt.Errorf("oci: enable the pids controller in %s: %w", dir, err)
	}
	return nil
}

// capGuestsPids caps the guests' process total in d.guestsCgroup (capPids, guestsPidsMax)
// and logs it. A failure is logged, not returned: each guest's own limit still holds, and a
// node that ran before on this host must not stop starting for it.
func (d *Driver) capGuestsPids(pidMaxFile, threadsMaxFile string) {
	tasks, err := hostTasks(pidMaxFile, threadsMaxFile)
	if err == nil {
		var got int64
		var kept bool
		limit := guestsPidsMax(tasks)
		if got, kept, err = d.cg.capPids(d.guestsCgroup, limit); err == nil && got < limit {
			// Kept, as an operator's would be; but a test's, an older release's, or one from
			// before pid_max was raised holds every guest on the host to it for good, unseen.
			d.log.Warn("oci: the guests' process total is lower than this node's, and is kept: if it is not the operator's, write max to its pids.max and restart a node",
				"cgroup", d.guestsCgroup, "file", filepath.Join(d.cg.pidsDir(d.guestsCgroup), "pids.max"), "pids_max", got, "node_total", limit, "host_tasks", tasks)
			return
		}
		if err == nil {
			d.log.Info("oci: guests' process total capped, leaving the rest of the host's process ids to the platform",
				"cgroup", d.guestsCgroup, "pids_max", got, "host_tasks", tasks, "reserve", tasks-got, "kept_lower_limit", kept)
			return
		}
	}
	d.log.Warn("oci: the guests' process total is not capped: guests together may take the host's last process ids, and then the platform cannot fork",
		"cgroup", d.guestsCgroup, "err", err)
}

// guestsTotalNote says, when the guests on the host hold 90% or more of their process total,
// so: a guest's start then fails on a fork (runc) or with a Go runtime's crash (runsc), and
// a runsc sandbox dies when it needs one more host task, in words that do not say that
// other guests' processes took the room. "" otherwise.
func (d *Driver) guestsTotalNote() string {
	dir := d.cg.pidsDir(d.guestsCgroup)
	cur, err := readInt(filepath.Join(dir, "pids.current"))
	if err != nil {
		return ""
	}
	limit, err := readInt(filepath.Join(dir, "pids.max"))
	if err != nil || limit < 0 || cur*10 < limit*9 {
		return ""
	}
	return fmt.Sprintf("the host's guests hold %d processes of their total of %d (%s pids.max): other guests' processes may have left this one none", cur, limit, d.guestsCgroup)
}

// atGuestsTotal adds guestsTotalNote to err, a guest's failed start.
func (d *Driver) atGuestsTotal(err error) error {
	if note := d.guestsTotalNote(); note != "" {
		return fmt.Errorf("oci: %s: %w", note, err)
	}
	return err
}

// checkGuestsCgroup: guests is an absolute cgroup other than the root (whose pids.max does
// not exist), and parent is guests or below it.
func checkGuestsCgroup(guests, parent string) error {
	guests, parent = filepath.Clean(guests), filepath.Clean(parent)
	if !filepath.IsAbs(guests) || guests == "/" {
		return fmt.Errorf("oci: GuestsCgroup %q must be an absolute cgroup below the root", guests)
	}
	if parent != guests && !strings.HasPrefix(parent, guests+"/") {
		return fmt.Errorf("oci: CgroupParent %q must be GuestsCgroup %q or below it", parent, guests)
	}
	return nil
}
