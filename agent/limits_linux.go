//go:build linux

package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

const (
	capSysAdmin    = 21 // CAP_SYS_ADMIN
	prCapbsetRead  = 23 // PR_CAPBSET_READ
	prCapbsetDrop  = 24 // PR_CAPBSET_DROP
	prSetDumpable  = 4  // PR_SET_DUMPABLE
	linuxCapV3     = 0x20080522
	guestCgroupDir = "/sys/fs/cgroup"
	workCgroup     = "wb-work"

	// atLimitFor is how long the guest's processes may stay at their limit before the agent
	// ends them all. gVisor's ptrace platform keeps adding host threads while a fork bomb
	// churns at the limit (~300–600 a second here), so a bomb left alone would take the
	// sandbox down in seconds; a guest whose every fork fails has nothing left to lose. One
	// second, not two: on a loaded host the churn until the agent acts is what kills a
	// sandbox (CI saw one die under a fork bomb with two).
	atLimitFor   = time.Second
	atLimitCheck = 100 * time.Millisecond
	// guardAsleepLook is how often the guard looks while nothing should fork (bombGuard's
	// asleep): a runner a guest process started through the agent's socket may fork all the
	// same. A look is about 3 ms of host CPU under gVisor's ptrace platform: every 10 s,
	// 0.03 % of a core for an idle guest, whose sandbox alone costs 0.1 %.
	guardAsleepLook = 10 * time.Second
	killAllRounds   = 200
	killAllBetween  = 10 * time.Millisecond
)

// childCgroup is the pids cgroup every exec and PTY process starts in, so that the guest's
// processes meet their limit while the agent (its other threads left in the root cgroup) still
// has room to answer. It exists only where the agent, as the guest's init, could mount a pids
// cgroup (gVisor implements cgroupfs inside the sandbox; the driver gives the agent
// CAP_SYS_ADMIN there for this).
//
// Guest root passes the hierarchy's permission checks whatever its capabilities: with it
// mounted, an exec raised wb-work's pids.max to 100000 and moved itself to the root cgroup,
// out of the limit and out of the guard's sight. So the agent unmounts the hierarchy once it
// is set up (no guest process can mount it again: none holds CAP_SYS_ADMIN), and keeps no
// file of it open that a write could use: gVisor checks no ptrace access on /proc/1/fd, and
// guest root reopened the agent's open tasks and pids.max files there, for writing, and
// escaped as before. What stays open is pids.current, which no write changes. Instead of
// moving a thread in and out of the work cgroup around each fork (which needs both cgroups'
// tasks files open), one OS thread, moved into it at setup and locked to the spawner
// goroutine for the agent's life, makes every fork; Go starts its new threads from a thread
// of its own, never from a locked one, so no other thread of the agent joins it.
type childCgroup struct {
	work string // the work cgroup's directory, for messages
	max  int
	// current is the work cgroup's pids.current, open read-only for the agent's life.
	current *os.File
	// spawner counts in current (gVisor's pids controller counts threads): the count with
	// nothing else in the cgroup, read once the spawner was in it.
	base  int
	spawn chan<- spawnRequest // to the spawner's thread
	done  <-chan struct{}     // closed when the spawner has ended
	// ending is set while the agent ends every process (endAll): a start then is refused as
	// at the limit (the limit's drop to 0 refused it once; the rounds would kill it unseen).
	ending atomic.Bool
	// endMu makes the guard's and the node's ends (endAll) one at a time.
	endMu sync.Mutex
}

// spawnRequest is one startFn for the spawner's thread to run, and where its answer goes.
type spawnRequest struct {
	startFn func() (int, error)
	answer  chan<- spawnAnswer
}

type spawnAnswer struct {
	pid int
	err error
}

// setupChildCgroup mounts a pids cgroup hierarchy at /sys/fs/cgroup, creates the work cgroup
// with pids.max = max, moves the spawner's thread into it, opens its pids.current and unmounts
// the hierarchy again. It answers nil, with a warning in the log, where it cannot, or where
// the agent is not the guest's init (ending a fork bomb takes init's kill(-1): the agent keeps
// no file that lists the cgroup's processes). The spawner ends with ctx.
func setupChildCgroup(ctx context.Context, log *slog.Logger, max int, init bool) *childCgroup {
	if max <= 0 {
		return nil
	}
	fail := func(step string, err error) *childCgroup {
		log.Warn("agent: no process limit of its own for the guest's processes; the sandbox's applies", "step", step, "err", err)
		return nil
	}
	if !init {
		return fail("be the guest's init", errors.New("only the guest's init can end every process of a fork bomb"))
	}
	root := guestCgroupDir
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err != nil {
		return fail("read /proc/self/mountinfo", err)
	} else if at, ok := pidsHierarchyMount(mounts); ok {
		// Mounted by someone else, who may need it: the agent leaves it, and guest root could
		// use it as above (a second mount of a controller is the same hierarchy).
		return fail("mount a pids cgroup at "+root, fmt.Errorf("a pids cgroup hierarchy is already mounted at %s, where guest root could raise its limit or leave it", at))
	}
	if err := syscall.Mount("cgroup", root, "cgroup", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "pids"); err != nil {
		return fail("mount a pids cgroup at "+root, err)
	}
	// Unmounted on every path out: left mounted, guest root could use it as above.
	defer func() {
		if err := syscall.Unmount(root, syscall.MNT_DETACH); err != nil {
			log.Warn("agent: the guest's pids cgroup stays mounted: guest root can raise its limit or leave it", "cgroup", root, "err", err)
		}
	}()
	work := filepath.Join(root, workCgroup)
	if err := os.Mkdir(work, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fail("create "+work, err)
	}
	if err := os.WriteFile(filepath.Join(work, "pids.max"), []byte(strconv.Itoa(max)), 0); err != nil {
		return fail("set "+work+"/pids.max", err)
	}
	current, err := os.Open(filepath.Join(work, "pids.current"))
	if err != nil {
		return fail("open "+work+"/pids.current", err)
	}
	spawn, done, err := startSpawner(ctx, func(tid int) error {
		return os.WriteFile(filepath.Join(work, "tasks"), []byte(strconv.Itoa(tid)), 0)
	})
	if err != nil {
		current.Close()
		return fail("move the spawner's thread into "+work, err)
	}
	c := &childCgroup{work: work, max: max, current: current, spawn: spawn, done: done}
	if c.base, err = c.counter()(); err != nil {
		return fail("read "+work+"/pids.current", err)
	}
	log.Info("agent: the guest's processes start in a pids cgroup", "cgroup", work, "pids_max", max)
	return c
}

// pidsHierarchyMount answers where mountinfo (/proc/self/mountinfo's format) shows a cgroup v1
// hierarchy with the pids controller mounted, if it does.
func pidsHierarchyMount(mountinfo []byte) (string, bool) {
	for line := range bytes.Lines(mountinfo) {
		fields, super, ok := bytes.Cut(line, []byte(" - "))
		f, s := bytes.Fields(fields), bytes.Fields(super)
		if !ok || len(f) < 5 || len(s) < 3 || string(s[0]) != "cgroup" {
			continue
		}
		for opt := range bytes.SplitSeq(s[2], []byte(",")) {
			if string(opt) == "pids" {
				return string(f[4]), true
			}
		}
	}
	return "", false
}

// startSpawner starts the goroutine that runs every startFn sent to spawn, on one OS thread
// locked to it for life: enter(tid) moves that thread where its children must start. The
// goroutine ends with ctx, and done is closed then; its thread ends with it (a goroutine that
// ends locked takes its thread with it), so none of Go's threads is left where it was moved.
func startSpawner(ctx context.Context, enter func(tid int) error) (spawn chan<- spawnRequest, done <-chan struct{}, err error) {
	requests, ended, entered := make(chan spawnRequest), make(chan struct{}), make(chan error, 1)
	go func() {
		defer close(ended)
		// Locked before it moves, and never unlocked: LockOSThread starts Go's template
		// thread (from this thread, still where the agent runs) if none exists yet.
		runtime.LockOSThread()
		if err := enter(syscall.Gettid()); err != nil {
			entered <- err
			return
		}
		entered <- nil
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-requests:
				pid, err := r.startFn()
				r.answer <- spawnAnswer{pid, err}
			}
		}
	}()
	if err := <-entered; err != nil {
		return nil, nil, err
	}
	return requests, ended, nil
}

// startIn runs startFn (which forks one child) on the spawner's thread, in the work cgroup, so
// that the child and everything it starts count against the guest's process limit.
func (c *childCgroup) startIn(startFn func() (int, error)) (int, error) {
	if c == nil {
		return startFn()
	}
	answer := make(chan spawnAnswer, 1)
	start := func() (int, error) { // on the spawner's thread, just before the fork
		if c.ending.Load() {
			return 0, fmt.Errorf("the agent is ending every process of the guest, which pressed on its own limit or its sandbox's host task limit, a fork bomb's mark: %w", syscall.EAGAIN)
		}
		return startFn()
	}
	select {
	case c.spawn <- spawnRequest{start, answer}:
	case <-c.done:
		return 0, errors.New("start a process in the guest's pids cgroup: the agent is stopping")
	}
	a := <-answer
	return a.pid, a.err
}

// guard ends every process of the work cgroup once they have pressed on their limit for
// atLimitFor (see bombWatch and bombGuard: it samples only while a process other than
// idle() runners lives there, and less often while their count stays low), until ctx ends.
// woken must hold a value after every start of a process and every runner handed its code.
func (c *childCgroup) guard(ctx context.Context, log *slog.Logger, idle func() int, woken <-chan struct{}) {
	if c == nil {
		return
	}
	count := c.counter()
	bombGuard{max: c.max, every: atLimitCheck, slowest: 8 * atLimitCheck, asleep: guardAsleepLook, count: count,
		idle: func() int { return c.base + idle() }, woken: woken,
		endAll: func(since time.Time) {
			n := c.endAll()
			log.Warn("agent: the guest's processes stayed at their limit; ended them all (a fork bomb?)", "pids_max", c.max, "for", time.Since(since).Round(time.Millisecond), "killed", n)
		}}.run(ctx)
}

// endAll ends every process of the guest but the agent (killAll), refusing starts meanwhile,
// and answers how many it found at most: the guard's end, and the node's (POST
// /v1/procs/end), one at a time.
func (c *childCgroup) endAll() int {
	c.endMu.Lock()
	defer c.endMu.Unlock()
	c.ending.Store(true)
	defer c.ending.Store(false)
	return killAll(c.counter(), c.base)
}

// counter answers a reader of the work cgroup's pids.current: one pread of the open file
// (os.ReadFile's open, stat, reads and close were nine system calls a sample, each trapped
// under gVisor's ptrace platform; File.ReadAt reads again until EOF, a second).
func (c *childCgroup) counter() func() (int, error) {
	fd := int(c.current.Fd()) // open for the agent's life
	var buf [32]byte
	return func() (int, error) {
		n, err := syscall.Pread(fd, buf[:], 0)
		if err != nil {
			return 0, fmt.Errorf("read %s/pids.current: %w", c.work, err)
		}
		return strconv.Atoi(string(bytes.TrimSpace(buf[:max(n, 0)])))
	}
}

// killAll SIGKILLs every process of the guest but the agent, as its init, in rounds until the
// work cgroup's count is back to base (or killAllRounds passed: one call signals every process
// there is, where reading and killing them one by one lets a starved agent fall behind, but a
// child forked during it may be missed), and answers how many it found there at most.
func killAll(count func() (int, error), base int) int {
	n := 0
	for range killAllRounds {
		cur, err := count()
		if err != nil || cur <= base {
			return n
		}
		if syscall.Kill(-1, syscall.SIGKILL) == nil {
			n = max(n, cur-base)
		}
		time.Sleep(killAllBetween)
	}
	return n
}

// undumpable keeps the guest's own processes out of the agent: a process that is not dumpable
// cannot be traced, and its /proc files (mem, environ, its open files under fd) are opened
// only with CAP_SYS_PTRACE, which no guest process holds, root in the guest included.
// Without it, guest root could write through /proc/1/fd/2 to the agent's stderr: under runsc
// that is the host's console log of the guest, which grew on the host's disk past the
// guest's disk allowance; and by ptrace it could stop the agent or speak in its place. The
// flag is the process's, not a thread's; what the agent starts is dumpable again at its exec.
func undumpable() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", errno)
	}
	return nil
}

// dropSysAdmin removes CAP_SYS_ADMIN from every thread of the agent (bounding, effective,
// permitted and inheritable sets), so that no process it starts ever holds it. It is a no-op
// where the agent does not hold it.
func dropSysAdmin() error {
	type capHeader struct {
		version uint32
		pid     int32
	}
	type capData struct{ effective, permitted, inheritable uint32 }
	hdr := capHeader{version: linuxCapV3}
	var data [2]capData
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return fmt.Errorf("capget: %w", errno)
	}
	const bit = uint32(1) << capSysAdmin
	inBounding, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prCapbsetRead, capSysAdmin, 0)
	if errno == 0 && inBounding == 1 {
		if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, prCapbsetDrop, capSysAdmin, 0); errno != 0 {
			return fmt.Errorf("drop CAP_SYS_ADMIN from the bounding set: %w", errno)
		}
	}
	if data[0].effective&bit == 0 && data[0].permitted&bit == 0 && data[0].inheritable&bit == 0 {
		return nil
	}
	data[0].effective &^= bit
	data[0].permitted &^= bit
	data[0].inheritable &^= bit
	hdr = capHeader{version: linuxCapV3}
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return fmt.Errorf("capset without CAP_SYS_ADMIN: %w", errno)
	}
	return nil
}
