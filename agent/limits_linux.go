//go:build linux

package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
//
// Guest root passes the hierarchy's permission checks whatever its capabilities: with it
// mounted, an exec raised wb-work's pids.max to 100000 and moved itself to the root cgroup,
// out of the limit and out of the guard's sight. So the agent opens the files it uses, then
// unmounts the hierarchy; no guest process can mount it again (none holds CAP_SYS_ADMIN).
type childCgroup struct {
	work string // the work cgroup's directory, for messages
	max  int
	// init: the agent is the guest's PID 1, so kill(-1) reaches every other process of the
	// guest (they are all the work cgroup's) in one call, however fast a bomb forks.
	init bool
	// The hierarchy's files the agent uses: the work and root cgroups' tasks (a thread moves
	// in to fork and back), the work cgroup's pids.max, cgroup.procs and pids.current.
	workTasks, rootTasks, workMax, workProcs, workCurrent *os.File
}

// setupChildCgroup mounts a pids cgroup hierarchy at /sys/fs/cgroup, creates the work cgroup
// with pids.max = max, opens the files the agent uses and unmounts the hierarchy again. It
// answers nil, with a warning in the log, where it cannot. init says the agent is the guest's
// PID 1.
func setupChildCgroup(log *slog.Logger, max int, init bool) *childCgroup {
	if max <= 0 {
		return nil
	}
	fail := func(step string, err error) *childCgroup {
		log.Warn("agent: no process limit of its own for the guest's processes; the sandbox's applies", "step", step, "err", err)
		return nil
	}
	root := guestCgroupDir
	mounted := false
	if _, err := os.Stat(filepath.Join(root, "pids.max")); err != nil {
		if err := syscall.Mount("cgroup", root, "cgroup", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "pids"); err != nil {
			return fail("mount a pids cgroup at "+root, err)
		}
		mounted = true
	}
	work := filepath.Join(root, workCgroup)
	if err := os.Mkdir(work, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fail("create "+work, err)
	}
	if err := os.WriteFile(filepath.Join(work, "pids.max"), []byte(strconv.Itoa(max)), 0); err != nil {
		return fail("set "+work+"/pids.max", err)
	}
	c := &childCgroup{work: work, max: max, init: init}
	for _, f := range []struct {
		file **os.File
		path string
		flag int
	}{
		{&c.workTasks, filepath.Join(work, "tasks"), os.O_WRONLY},
		{&c.rootTasks, filepath.Join(root, "tasks"), os.O_WRONLY},
		{&c.workMax, filepath.Join(work, "pids.max"), os.O_WRONLY},
		{&c.workProcs, filepath.Join(work, "cgroup.procs"), os.O_RDONLY},
		{&c.workCurrent, filepath.Join(work, "pids.current"), os.O_RDONLY},
	} {
		h, err := os.OpenFile(f.path, f.flag, 0)
		if err != nil {
			return fail("open "+f.path, err)
		}
		*f.file = h
	}
	if mounted {
		if err := syscall.Unmount(root, syscall.MNT_DETACH); err != nil {
			log.Warn("agent: the guest's pids cgroup stays mounted: guest root can raise its limit or leave it", "cgroup", root, "err", err)
		}
	}
	log.Info("agent: the guest's processes start in a pids cgroup", "cgroup", work, "pids_max", max)
	return c
}

// enter moves the calling OS thread into the work cgroup (a child forked from it starts
// there) and returns the function that moves it back. The caller must have locked the thread.
// Moving a thread never fails for a full cgroup: the pids limit applies to forks only.
func (c *childCgroup) enter() (leave func(), err error) {
	tid := []byte(strconv.Itoa(syscall.Gettid()))
	if _, err := c.workTasks.WriteAt(tid, 0); err != nil {
		return nil, fmt.Errorf("enter the guest's pids cgroup: %w", err)
	}
	return func() { _, _ = c.rootTasks.WriteAt(tid, 0) }, nil
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
// idle() runners lives there, and less often while their count stays low), until ctx ends.
// woken must hold a value after every start of a process and every runner handed its code.
func (c *childCgroup) guard(ctx context.Context, log *slog.Logger, idle func() int, woken <-chan struct{}) {
	if c == nil {
		return
	}
	bombGuard{max: c.max, every: atLimitCheck, slowest: 8 * atLimitCheck, count: c.counter(), idle: idle, woken: woken,
		endAll: func(since time.Time) {
			n := c.killAll()
			log.Warn("agent: the guest's processes stayed at their limit; ended them all (a fork bomb?)", "pids_max", c.max, "for", time.Since(since).Round(time.Millisecond), "killed", n)
		}}.run(ctx)
}

// counter answers a reader of the work cgroup's pids.current: one pread of the open file
// (os.ReadFile's open, stat, reads and close were nine system calls a sample, each trapped
// under gVisor's ptrace platform; File.ReadAt reads again until EOF, a second).
func (c *childCgroup) counter() func() (int, error) {
	fd := int(c.workCurrent.Fd()) // open for the agent's life
	var buf [32]byte
	return func() (int, error) {
		n, err := syscall.Pread(fd, buf[:], 0)
		if err != nil {
			return 0, fmt.Errorf("read %s/pids.current: %w", c.work, err)
		}
		return strconv.Atoi(string(bytes.TrimSpace(buf[:max(n, 0)])))
	}
}

// killAll SIGKILLs every process of the work cgroup, with its limit at 0 meanwhile so that
// none can fork a replacement, and answers how many it signalled (as init, how many the
// cgroup held when it began).
func (c *childCgroup) killAll() int {
	_, _ = c.workMax.WriteAt([]byte("0"), 0)
	defer func() { _, _ = c.workMax.WriteAt([]byte(strconv.Itoa(c.max)), 0) }()
	n := 0
	for range killAllRounds {
		b, err := readAllAt(c.workProcs)
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

// readAllAt reads what f holds from its start, as a cgroup file answers it now.
func readAllAt(f *os.File) ([]byte, error) {
	var b []byte
	buf := make([]byte, 4096)
	for {
		n, err := f.ReadAt(buf, int64(len(b)))
		b = append(b, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
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
