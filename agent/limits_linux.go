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
	atLimitFor     = time.Second
	atLimitCheck   = 100 * time.Millisecond
	killAllRounds  = 200
	killAllBetween = 10 * time.Millisecond
)

// childCgroup is the pids cgroup every exec and PTY process starts in, so that the guest's
// processes meet their limit while the agent (left in the root cgroup) still has room to
// answer. It exists only where the agent could mount a pids cgroup (gVisor implements
// cgroupfs inside the sandbox; the driver gives the agent CAP_SYS_ADMIN there for this).
type childCgroup struct {
	work string // the work cgroup's directory
	root string // the root cgroup's directory
	max  int
	// init: the agent is the guest's PID 1, so kill(-1) reaches every other process of the
	// guest (they are all the work cgroup's) in one call, however fast a bomb forks.
	init bool
}

// setupChildCgroup mounts a pids cgroup hierarchy at /sys/fs/cgroup and creates the work
// cgroup with pids.max = max. It answers nil, with a warning in the log, where it cannot.
// init says the agent is the guest's PID 1.
func setupChildCgroup(log *slog.Logger, max int, init bool) *childCgroup {
	if max <= 0 {
		return nil
	}
	fail := func(step string, err error) *childCgroup {
		log.Warn("agent: no process limit of its own for the guest's processes; the sandbox's applies", "step", step, "err", err)
		return nil
	}
	root := guestCgroupDir
	if _, err := os.Stat(filepath.Join(root, "pids.max")); err != nil {
		if err := syscall.Mount("cgroup", root, "cgroup", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "pids"); err != nil {
			return fail("mount a pids cgroup at "+root, err)
		}
	}
	work := filepath.Join(root, workCgroup)
	if err := os.Mkdir(work, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fail("create "+work, err)
	}
	if err := os.WriteFile(filepath.Join(work, "pids.max"), []byte(strconv.Itoa(max)), 0); err != nil {
		return fail("set "+work+"/pids.max", err)
	}
	log.Info("agent: the guest's processes start in a pids cgroup", "cgroup", work, "pids_max", max)
	return &childCgroup{work: work, root: root, max: max, init: init}
}

// enter moves the calling OS thread into the work cgroup (a child forked from it starts
// there) and returns the function that moves it back. The caller must have locked the thread.
// Moving a thread never fails for a full cgroup: the pids limit applies to forks only.
func (c *childCgroup) enter() (leave func(), err error) {
	tid := []byte(strconv.Itoa(syscall.Gettid()))
	if err := os.WriteFile(filepath.Join(c.work, "tasks"), tid, 0); err != nil {
		return nil, fmt.Errorf("enter the guest's pids cgroup: %w", err)
	}
	return func() { _ = os.WriteFile(filepath.Join(c.root, "tasks"), tid, 0) }, nil
}

// startIn runs startFn (which forks one child) from a thread in the work cgroup, so that the
// child and everything it starts count against the guest's process limit.
func (c *childCgroup) startIn(startFn func() (int, error)) (int, error) {
	if c == nil {
		return startFn()
	}
	runtime.LockOSThread()
	leave, err := c.enter()
	if err != nil {
		runtime.UnlockOSThread()
		return 0, err
	}
	pid, err := startFn()
	leave()
	runtime.UnlockOSThread()
	return pid, err
}

// guard ends every process of the work cgroup once they have pressed on their limit for
// atLimitFor (see bombWatch and bombGuard: it samples only while a process other than
// idle() runners lives there, and less often while their count stays low), until ctx ends. woken must hold a value after every start
// of a process and every runner handed its code.
func (c *childCgroup) guard(ctx context.Context, log *slog.Logger, idle func() int, woken <-chan struct{}) {
	if c == nil {
		return
	}
	count, closeCount := c.counter()
	defer closeCount()
	bombGuard{max: c.max, every: atLimitCheck, slowest: 8 * atLimitCheck, count: count, idle: idle, woken: woken,
		endAll: func(since time.Time) {
			n := c.killAll()
			log.Warn("agent: the guest's processes stayed at their limit; ended them all (a fork bomb?)", "pids_max", c.max, "for", time.Since(since).Round(time.Millisecond), "killed", n)
		}}.run(ctx)
}

// counter answers a reader of the work cgroup's pids.current, and what closes it. It keeps
// the file open and reads it with one pread: os.ReadFile's open, stat, reads and close were
// nine system calls a sample, each trapped under gVisor's ptrace platform.
func (c *childCgroup) counter() (func() (int, error), func()) {
	path := filepath.Join(c.work, "pids.current")
	f, err := os.Open(path)
	if err != nil {
		return func() (int, error) { return readCgroupInt(path) }, func() {}
	}
	fd := int(f.Fd()) // f stays open (and reachable) until the returned close
	var buf [32]byte
	return func() (int, error) {
		// One pread: File.ReadAt reads again until EOF, a second system call.
		n, err := syscall.Pread(fd, buf[:], 0)
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", path, err)
		}
		return strconv.Atoi(string(bytes.TrimSpace(buf[:max(n, 0)])))
	}, func() { _ = f.Close() }
}

// killAll SIGKILLs every process of the work cgroup, with its limit at 0 meanwhile so that
// none can fork a replacement, and answers how many it signalled (as init, how many the
// cgroup held when it began).
func (c *childCgroup) killAll() int {
	maxFile := filepath.Join(c.work, "pids.max")
	_ = os.WriteFile(maxFile, []byte("0"), 0)
	defer func() { _ = os.WriteFile(maxFile, []byte(strconv.Itoa(c.max)), 0) }()
	n := 0
	for range killAllRounds {
		b, err := os.ReadFile(filepath.Join(c.work, "cgroup.procs"))
		if err != nil {
			return n
		}
		pids := bytes.Fields(b)
		if len(pids) == 0 {
			return n
		}
		if c.init {
			// One call signals them all, where reading and killing them one by one lets a
			// starved agent fall behind.
			if syscall.Kill(-1, syscall.SIGKILL) == nil {
				n = max(n, len(pids))
			}
			time.Sleep(killAllBetween)
			continue
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(string(p)); err == nil && pid > 1 {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					n++
				}
			}
		}
		time.Sleep(killAllBetween)
	}
	return n
}

func readCgroupInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(bytes.TrimSpace(b)))
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
