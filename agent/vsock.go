package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// VsockUnixDirEnv names the environment variable that stands in for a vsock device: when it is
// set, `wb agent --vsock-port N` listens on the Unix socket $WB_VSOCK_UNIX_DIR/N.sock instead of
// AF_VSOCK port N. The test VMM (which runs guests without a vsock device) sets it and bridges
// hybrid-vsock CONNECT N to that socket.
const VsockUnixDirEnv = "WB_VSOCK_UNIX_DIR"

// VsockUnixSocket is the Unix socket that stands for vsock port in dir (see VsockUnixDirEnv).
func VsockUnixSocket(dir string, port uint32) string {
	return filepath.Join(dir, strconv.FormatUint(uint64(port), 10)+".sock")
}

// vsockAddr is an AF_VSOCK address (context id and port).
type vsockAddr struct{ cid, port uint32 }

func (a vsockAddr) Network() string { return "vsock" }
func (a vsockAddr) String() string  { return fmt.Sprintf("vsock:%d:%d", a.cid, a.port) }

// vsockListener accepts AF_VSOCK stream connections. The standard library has no vsock
// support (net.FileListener refuses the family), so the socket is a non-blocking fd in an
// os.File: the runtime's poller wakes Accept, and Close unblocks it.
type vsockListener struct {
	f    *os.File
	addr vsockAddr

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// listenVsock listens on AF_VSOCK port on any context id (the guest's own).
func listenVsock(port uint32) (net.Listener, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("agent: vsock socket (is the vsock driver loaded?): %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("agent: bind vsock port %d: %w", port, err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("agent: listen on vsock port %d: %w", port, err)
	}
	addr := vsockAddr{cid: unix.VMADDR_CID_ANY, port: port}
	if sa, err := unix.Getsockname(fd); err == nil {
		if vm, ok := sa.(*unix.SockaddrVM); ok {
			addr = vsockAddr{cid: vm.CID, port: vm.Port}
		}
	}
	return newVsockListener(fd, addr), nil
}

// newVsockListener wraps fd, a listening non-blocking stream socket.
func newVsockListener(fd int, addr vsockAddr) *vsockListener {
	return &vsockListener{f: os.NewFile(uintptr(fd), addr.String()), addr: addr}
}

func (l *vsockListener) Accept() (net.Conn, error) {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return nil, l.closedOr(err)
	}
	var (
		nfd    int
		peer   unix.Sockaddr
		accErr error
	)
	err = rc.Read(func(fd uintptr) bool {
		nfd, peer, accErr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		return !errors.Is(accErr, unix.EAGAIN) // false: wait until readable, then try again
	})
	if err != nil {
		return nil, l.closedOr(err)
	}
	if accErr != nil {
		return nil, fmt.Errorf("agent: vsock accept: %w", accErr)
	}
	remote := vsockAddr{}
	if vm, ok := peer.(*unix.SockaddrVM); ok {
		remote = vsockAddr{cid: vm.CID, port: vm.Port}
	}
	return &vsockConn{File: os.NewFile(uintptr(nfd), remote.String()), local: l.addr, remote: remote}, nil
}

// closedOr maps the error of an operation on a closed listener to net.ErrClosed, which
// http.Server expects at shutdown (the poller's own error for it is not exported).
func (l *vsockListener) closedOr(err error) error {
	if l.closed.Load() || errors.Is(err, os.ErrClosed) {
		return net.ErrClosed
	}
	return fmt.Errorf("agent: vsock accept: %w", err)
}

func (l *vsockListener) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		l.closeErr = l.f.Close()
	})
	return l.closeErr
}

func (l *vsockListener) Addr() net.Addr { return l.addr }

// vsockConn is one accepted vsock stream: the os.File gives Read, Write, Close and deadlines
// through the runtime's poller.
type vsockConn struct {
	*os.File
	local, remote vsockAddr
}

func (c *vsockConn) LocalAddr() net.Addr  { return c.local }
func (c *vsockConn) RemoteAddr() net.Addr { return c.remote }
