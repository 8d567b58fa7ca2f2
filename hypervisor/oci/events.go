package oci

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"wb/hypervisor"
	"wb/internal/proc"
)

// Events polls the guest: its cgroup's OOM-kill counter (an "oom" event per new kill), its
// init/sandbox process (an "exit" event once it is gone: runsc's sandbox ends with its
// container's process, so the runtime is not asked) and, for a runsc sandbox with a process
// limit, its host tasks (a "pids" event as they near the limit, see sandboxPids). The channel
// closes after "exit" or when ctx ends. The same polling works for runc and runsc and for
// cgroup v1 and v2 (runsc events carries no OOM notifications).
// A guest this driver created, whose process still lives, is followed from that process
// without a first runtime call (see rememberInit).
func (d *Driver) Events(ctx context.Context, id string) (<-chan hypervisor.Event, error) {
	g, err := d.loadGuest(id)
	if err != nil {
		return nil, err
	}
	var p initProc
	if known, ok := d.knownInit(id); ok {
		p = known
	} else {
		info, err := d.Info(ctx, id)
		if err != nil {
			return nil, err
		}
		if info.State != hypervisor.StateStopped {
			p.pid = info.Pid
			p.start, _ = proc.Start(p.pid)
		}
	}
	baseline, err := d.cg.oomKills(g.CgroupsPath)
	if err != nil {
		baseline = 0
	}
	// A runc guest's processes are the host's, held to its limit where forks fail; a runsc
	// sandbox dies at its limit. Its limit is set at its create and read once.
	var pidsCur string
	var pids sandboxPids
	if cur, limit := d.cg.pidsFiles(g.CgroupsPath); d.name == RuntimeRunsc && cur != "" {
		if n, err := readInt(limit); err == nil && n > 0 {
			pidsCur, pids = cur, newSandboxPids(n)
			// A count past half already (a node's restart adopting the guest: it does not fall
			// back once a bomb was ended) is where the watch starts, not a report: reported,
			// it had the agent end every process of a guest that ran no bomb.
			if c, err := readInt(cur); err == nil {
				pids.observe(c)
			}
		}
	}
	ch := make(chan hypervisor.Event, 16)
	go d.watch(ctx, id, g.CgroupsPath, p, baseline, pidsCur, pids, ch)
	return ch, nil
}

// watch follows process p of guest id (a zero p: the guest had stopped), and the host tasks
// in pidsCur (a pids.current file; "": none) against pids.
func (d *Driver) watch(ctx context.Context, id, cgPath string, p initProc, ooms int64, pidsCur string, pids sandboxPids, ch chan<- hypervisor.Event) {
	defer close(ch)
	send := func(typ string) bool {
		ev := hypervisor.Event{Type: typ, At: time.Now()}
		if typ == hypervisor.EventExit {
			ev.Detail = d.exitDetail(id, cgPath)
		}
		select {
		case ch <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	checkOOM := func() bool {
		n, err := d.cg.oomKills(cgPath)
		if err != nil {
			return true
		}
		for ; ooms < n; ooms++ {
			if !send(hypervisor.EventOOM) {
				return false
			}
		}
		return true
	}
	if p.pid == 0 {
		send(hypervisor.EventExit)
		return
	}
	pid, start := p.pid, p.start
	tick := time.NewTicker(d.eventInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !checkOOM() {
			return
		}
		if pidsCur != "" {
			if n, err := readInt(pidsCur); err == nil && pids.observe(n) {
				ev := hypervisor.Event{Type: hypervisor.EventPids, At: time.Now(), Detail: pidsReport(n, pids.max)}
				select {
				case ch <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
		// The runtime's state is the followed process's: runc's init, or runsc's sandbox,
		// which ends with its container's process (and with a checkpoint); so it is not asked.
		alive := pid > 0 && proc.Alive(pid, start)
		if !alive {
			if checkOOM() {
				send(hypervisor.EventExit)
			}
			return
		}
	}
}

// exitDetail describes a guest that exited, for the node's log: what its cgroup counted
// (a sandbox killed at its host process limit or its memory limit says so there) and the
// last lines of its console (the agent's log; runsc's own complaints).
func (d *Driver) exitDetail(id, cgPath string) string {
	const tail = 2048
	var b strings.Builder
	b.WriteString(d.cg.limitsReport(cgPath))
	if note := d.guestsTotalNote(); note != "" {
		b.WriteString("; " + note)
	}
	f, err := os.Open(d.ConsoleLog(id))
	if err != nil {
		fmt.Fprintf(&b, "; no console log: %v", err)
		return b.String()
	}
	defer f.Close()
	var buf []byte
	if st, err := f.Stat(); err == nil {
		off := max(st.Size()-tail, 0)
		buf = make([]byte, st.Size()-off)
		n, _ := f.ReadAt(buf, off)
		buf = buf[:n]
	}
	fmt.Fprintf(&b, "; console tail: %q", buf)
	return b.String()
}
