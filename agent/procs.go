package agent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// procTable knows the children the agent started itself (exec and pty), so that the PID-1
// reaper never reaps them: their statuses belong to the goroutines that Wait for them.
//
// The race it avoids: a reaper calling wait4(-1) could collect an exec's exit status before
// os/exec's Wait does, and the exec would then report a wrong exit code. Instead the reaper
// peeks at a zombie with waitid(P_ALL, WNOWAIT) (which collects nothing), skips it if it is one of
// ours, and otherwise collects exactly that pid. Starting a child and recording its pid happen
// under the same lock as a reaper pass, so no child of ours is ever seen unrecorded.
type procTable struct {
	cg   *childCgroup // where children start; nil: where the agent runs
	mu   sync.Mutex
	ours map[int]struct{}
	poke chan struct{} // a child of ours was collected: a zombie may have been hidden behind it
	// started holds a value after a child started, a runner was handed its code or a waiting
	// runner died: the fork-bomb guard, asleep while no guest process could fork, wakes on it.
	started chan struct{}
}

func newProcTable() *procTable {
	return &procTable{ours: map[int]struct{}{}, poke: make(chan struct{}, 1), started: make(chan struct{}, 1)}
}

// wake tells the fork-bomb guard that a guest process may now fork.
func (t *procTable) wake() {
	select {
	case t.started <- struct{}{}:
	default:
	}
}

// start runs startFn (which must start exactly one child and return its pid) under the table's
// lock and records the pid. The caller must call release(pid) once it has waited for the child.
func (t *procTable) start(startFn func() (int, error)) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pid, err := t.cg.startIn(startFn)
	if err != nil {
		return 0, err
	}
	t.ours[pid] = struct{}{}
	t.wake()
	return pid, nil
}

// release forgets pid after its owner waited for it.
func (t *procTable) release(pid int) {
	t.mu.Lock()
	delete(t.ours, pid)
	t.mu.Unlock()
	select {
	case t.poke <- struct{}{}:
	default:
	}
}

// reapLoop reaps orphaned zombies on SIGCHLD, after one of our children is collected, and every
// few seconds as a safety net, until ctx is done.
func (t *procTable) reapLoop(ctx context.Context, log *slog.Logger) {
	sigchld := make(chan os.Signal, 1) // signal.Notify drops signals while it is full: they coalesce
	signal.Notify(sigchld, syscall.SIGCHLD)
	defer signal.Stop(sigchld)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		if n := t.reapOnce(); n > 0 {
			log.Debug("agent: reaped orphans", "count", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-sigchld:
		case <-t.poke:
		case <-tick.C:
		}
	}
}

// reapOnce collects every zombie child that is not ours, stopping at the first one that is (its
// owner collects it soon and pokes the loop). It returns how many it collected.
func (t *procTable) reapOnce() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for n < 10000 {
		pid, err := peekZombie()
		if err != nil || pid <= 0 {
			return n
		}
		if _, mine := t.ours[pid]; mine {
			return n
		}
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err != nil && err != syscall.EINTR {
			return n
		}
		n++
	}
	return n
}

// signalSession sends sig to process group sid and to every other process of session sid (an
// interactive shell puts its jobs in process groups of their own).
func signalSession(sid int, sig syscall.Signal) {
	_ = syscall.Kill(-sid, sig)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, ok := procSession(pid); ok && s == sid {
			_ = syscall.Kill(pid, sig)
		}
	}
}

// procSession reads the session id of pid from /proc/PID/stat.
func procSession(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	// After the command: state ppid pgrp session ...
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return 0, false
	}
	sid, err := strconv.Atoi(f[3])
	return sid, err == nil
}

// spareThreadsFor answers how many spare OS threads the agent keeps as the guest's init.
// None when the guest's processes start in the work cgroup cg: they meet their limit there,
// and the agent, outside it, meets none inside the guest (a bomb past the sandbox's own host
// limit ends the sandbox, spare threads or not). Under gVisor's ptrace platform, where that
// cgroup exists, making 24 threads was a third of the agent's start: 319 of its 960 system
// calls, each trapped. Where there is none (runc: the container's limit counts the agent's
// threads too), spareOSThreads.
func spareThreadsFor(cg *childCgroup) int {
	if cg != nil {
		return 0
	}
	return spareOSThreads
}

// spareThreads makes the Go runtime create n OS threads now: each of n goroutines holds a
// thread of its own until all of them do, then lets it go. Go keeps idle threads for reuse and
// never ends them, so the agent has them when the guest's processes leave no room for new ones.
func spareThreads(n int) {
	var held, release sync.WaitGroup
	held.Add(n)
	release.Add(1)
	for range n {
		go func() {
			runtime.LockOSThread()
			held.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	held.Wait()
	release.Done()
}
