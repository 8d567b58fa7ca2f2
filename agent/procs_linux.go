//go:build linux

package agent

import (
	"syscall"
	"unsafe"
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
