package oci

import (
	"fmt"
	"path/filepath"
)

// A runsc sandbox's host tasks against its host limit (pidsLimits), which the event watch
// reads at each of its polls (one read of pids.current; pids.max once).
//
// The agent's own guard counts the guest's processes, not what they cost the host. Under
// gVisor's ptrace platform the sandbox's host tasks grow with the guest's processes' churn
// even while their count stays well below the guest's limit, and do not fall back when they
// end (runsc 20221219 keeps the stub processes in a pool, each with the threads it grew).
// Measured here: 10 loops that each run `sh -c :` over and over (20-odd guest processes of
// 64) grew an idle sandbox from 50 host tasks to 1,470 in 20 s and stayed there once they had
// ended; 20 such loops (some 40) reached 3,000 in 13 s and killed a sandbox held to that;
// in a loaded cold run, a fork bomb at 84–89 % of its guest's limit, below the guard's
// trigger, took its sandbox to 12,416 in about 7 s, where it died. So the driver watches the
// sandbox's own count and reports (hypervisor.EventPids) when it reaches half the host
// limit, and again each time it grows by another eighth; the node then has the agent end the
// guest's processes.
//
// Half: a sandbox grew by at most ~1,800 tasks a second (the cold run's bomb), so half of
// the least host limit (runscHostPidsMin, 8,192) leaves two seconds or more for a poll
// (200 ms), the node's request and the agent's kill rounds on a loaded host; and a workload
// that keeps a few dozen processes churning settles well below it (the 1,470 above, 12 % of
// the 12,416 of a session's Pids 1024). The eighths bound the reports to five in a sandbox's
// life, however it churns: each is a bomb that ending the processes did not hold, or a later
// one, since the count ratchets (three bombs in a row, each ended, left a sandbox held to
// 2,000 at 1,099, 1,368 and 1,621). A sandbox past its last report dies at its limit on the
// next such growth, as it did before the watch (guest_crash).
type sandboxPids struct {
	max  int64 // the sandbox's host limit
	next int64 // the count of the next report
}

// newSandboxPids watches a sandbox whose host limit is max (<= 0: none, never reported).
func newSandboxPids(max int64) sandboxPids { return sandboxPids{max: max, next: max / 2} }

// observe takes a reading of the sandbox's host tasks and answers whether it is a report.
func (w *sandboxPids) observe(cur int64) bool {
	if w.max <= 0 || cur < w.next {
		return false
	}
	w.next = cur + max(w.max/8, 1)
	return true
}

// pidsFiles are the pids.current and pids.max files of cgroupsPath p ("" where the host has
// no pids controller).
func (h cgroupHost) pidsFiles(p string) (current, limit string) {
	dir := filepath.Join(h.v2Root, p)
	if !h.v2 {
		if h.v1["pids"] == "" {
			return "", ""
		}
		dir = filepath.Join(h.v1["pids"], p)
	}
	return filepath.Join(dir, "pids.current"), filepath.Join(dir, "pids.max")
}

// pidsReport is an EventPids' detail.
func pidsReport(cur, limit int64) string {
	return fmt.Sprintf("the sandbox's host tasks: pids.current=%d of pids.max=%d (%d%%)", cur, limit, cur*100/limit)
}
