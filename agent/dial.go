package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// DialSocket connects to the Unix socket at path without following a symlink there: the
// agent's directory is the guest's to write (under gVisor), so a guest could plant a link to
// a host socket in place of the agent's. The socket is opened O_PATH|O_NOFOLLOW, checked to
// be a socket, and dialled through its /proc/self/fd entry, so what was checked is what is
// connected to.
func DialSocket(ctx context.Context, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("agent: open socket %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("agent: stat socket %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("agent: %s is not a socket (mode %#o); refusing to follow it", path, st.Mode)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

// ChmodSocket sets the mode of the Unix socket at path, which must be a socket and not a
// symlink (see DialSocket).
func ChmodSocket(path string, mode os.FileMode) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("agent: open socket %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("agent: stat socket %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("agent: %s is not a socket (mode %#o)", path, st.Mode)
	}
	if err := os.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode.Perm()); err != nil {
		return fmt.Errorf("agent: chmod socket %s: %w", path, err)
	}
	return nil
}
