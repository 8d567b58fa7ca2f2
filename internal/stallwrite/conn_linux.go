package stallwrite

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// setNotSentLowat sets TCP_NOTSENT_LOWAT on a TCP socket (on any other it fails, and is
// ignored: a Unix socket's writes are not queued unsent).
func setNotSentLowat(sc interface {
	SyscallConn() (syscall.RawConn, error)
}) {
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, NotSentLowat)
	})
}
