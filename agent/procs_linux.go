//go:build linux

package agent

import (
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// siginfo is the kernel's siginfo_t as filled for a child (the _sigchld member of its union).
// The union is pointer-aligned: the uintptr field gives body the same offset as in C (16 on
// 64-bit, 12 on 32-bit). The padding makes it at least the kernel's 128 bytes.
type siginfo struct {
	signo, errno, code int32
	body               struct {
		pid    int32
		uid    uint32
		status int32
		_      uintptr
	}
	_ [128]byte
}

const (
	pAll    = 0         // P_ALL
	wNoWait = 0x1000000 // WNOWAIT
)

// peekZombie returns the pid of a zombie child without collecting it, or 0 if there is none.
func peekZombie() (int, error) {
	for {
		var info siginfo
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pAll, 0, uintptr(unsafe.Pointer(&info)),
			syscall.WEXITED|syscall.WNOHANG|wNoWait, 0, 0)
		switch errno {
		case 0:
			return int(info.body.pid), nil
		case syscall.EINTR:
			continue
		default:
			return 0, errno // ECHILD: no children at all
		}
	}
}

// outputPipe makes a pipe for a command's stdout or stderr: its read end non-blocking and in
// Go's poller, for the agent; its write end blocking and outside the poller, for the child.
// os.Pipe puts both ends in the poller, non-blocking, and the child's start makes its end
// blocking again; its close then takes it out of the poller: five system calls a pipe that
// do nothing for the write end, each trapped under gVisor's ptrace platform, on every exec's
// way.
func outputPipe() (r, w *os.File, err error) { return pipeOneEndPolled(0) }

// inputPipe is outputPipe the other way round, for what a child reads (a runner's stdin and
// code): its write end non-blocking and in Go's poller, for the agent; its read end blocking
// and outside the poller, for the child.
func inputPipe() (r, w *os.File, err error) { return pipeOneEndPolled(1) }

// pipeOneEndPolled makes a pipe whose end agents (0 the read end, 1 the write end) is
// non-blocking and in Go's poller, and whose other end is blocking and outside it.
func pipeOneEndPolled(agents int) (r, w *os.File, err error) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	// A new pipe's end has no other flag to keep.
	if _, err := unix.FcntlInt(uintptr(fds[agents]), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		_, _ = syscall.Close(fds[0]), syscall.Close(fds[1])
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	// NewFile puts a non-blocking descriptor in the poller (deadlines work on it) and leaves
	// a blocking one out.
	return os.NewFile(uintptr(fds[0]), "|0"), os.NewFile(uintptr(fds[1]), "|1"), nil
}

// openDevNull opens /dev/null for reading, once, as every command's stdin without one of its
// own: os/exec opens and closes it for each command otherwise (its open tried in the poller,
// refused, then closed: five trapped system calls an exec under gVisor). Outside the poller
// (os.Open would try it there), and blocking, so that a child's start changes nothing on it.
func openDevNull() (*os.File, error) {
	fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: os.DevNull, Err: err}
	}
	return os.NewFile(uintptr(fd), os.DevNull), nil
}
