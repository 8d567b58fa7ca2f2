//go:build !linux

package stallwrite

import "syscall"

// setNotSentLowat does nothing where TCP_NOTSENT_LOWAT is not Linux's.
func setNotSentLowat(interface {
	SyscallConn() (syscall.RawConn, error)
}) {
}
