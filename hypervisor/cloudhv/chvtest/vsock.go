package chvtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// connectCommandMax is CH's PARTIALLY_READ_COMMAND_BUF_SIZE: a CONNECT line longer than this
// is refused.
const connectCommandMax = 32

// hybridVsock stands in for CH's virtio-vsock Unix backend (virtio-devices/src/vsock/unix):
// the host connects to socket, writes "CONNECT <port>\n", and gets "OK <local port>\n" once
// the guest accepted; the stream is then the guest's. The guest's listeners are Unix sockets
// <dir>/<port>.sock (see doc.go). Like CH, a bad command or a port nobody listens on closes
// the connection without an answer, and nothing is answered while the VM is paused.
type hybridVsock struct {
	socket string
	dir    string
	ln     *net.UnixListener
	log    *slog.Logger
	wait   func(ctx context.Context) bool // blocks while the VM is paused; false once it is gone

	mu        sync.Mutex
	localPort uint32
	conns     map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
}

// listenVsock binds the host socket. Like CH (UnixListener::bind) it fails when the path exists.
func listenVsock(socket, dir string, wait func(context.Context) bool, log *slog.Logger) (*hybridVsock, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("vsock: bind %s: %w", socket, err)
	}
	ln.SetUnlinkOnClose(true)
	v := &hybridVsock{socket: socket, dir: dir, ln: ln, log: log, wait: wait,
		localPort: 1<<30 - 1, conns: map[net.Conn]struct{}{}}
	v.wg.Add(1)
	go v.accept()
	return v, nil
}

func (v *hybridVsock) accept() {
	defer v.wg.Done()
	for {
		c, err := v.ln.Accept()
		if err != nil {
			return
		}
		if !v.track(c) {
			c.Close()
			return
		}
		v.wg.Add(1)
		go func() {
			defer v.wg.Done()
			defer v.untrack(c)
			v.serve(c)
		}()
	}
}

func (v *hybridVsock) track(c net.Conn) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return false
	}
	v.conns[c] = struct{}{}
	return true
}

func (v *hybridVsock) untrack(c net.Conn) {
	c.Close()
	v.mu.Lock()
	delete(v.conns, c)
	v.mu.Unlock()
}

// readConnect reads the command the way CH's muxer does: never past the '\n' (the bytes
// after it are the stream's), "connect " in any case, a decimal port.
func readConnect(c net.Conn) (uint32, error) {
	var buf []byte
	one := make([]byte, 1)
	for len(buf) < connectCommandMax {
		if _, err := io.ReadFull(c, one); err != nil {
			return 0, err
		}
		buf = append(buf, one[0])
		if one[0] == '\n' {
			break
		}
	}
	nl := bytes.IndexByte(buf, '\n')
	const prefix = "connect "
	if nl < 0 || len(buf) < len(prefix) || !strings.EqualFold(string(buf[:len(prefix)]), prefix) {
		return 0, fmt.Errorf("vsock: invalid port request %q", buf)
	}
	p, err := strconv.ParseUint(strings.TrimSpace(string(buf[len(prefix):nl])), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("vsock: invalid port request %q", buf)
	}
	return uint32(p), nil
}

func (v *hybridVsock) serve(c net.Conn) {
	port, err := readConnect(c)
	if err != nil {
		v.log.Debug("vsock: refused", "err", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if !v.wait(ctx) {
		return
	}
	g, err := net.Dial("unix", filepath.Join(v.dir, strconv.FormatUint(uint64(port), 10)+".sock"))
	if err != nil {
		// The guest answers RST; CH then drops the host stream without a word.
		v.log.Debug("vsock: nobody listens", "port", port, "err", err)
		return
	}
	if !v.track(g) {
		g.Close()
		return
	}
	defer v.untrack(g)
	v.mu.Lock()
	v.localPort = (v.localPort+1)&^(1<<31) | 1<<30
	lp := v.localPort
	v.mu.Unlock()
	if _, err := fmt.Fprintf(c, "OK %d\n", lp); err != nil {
		return
	}
	splice(c, g)
}

// splice copies both ways; each side's end of stream is passed on as a half-close.
func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
}

// close stops accepting, drops every connection (the device is gone) and removes the socket
// file, as CH's vsock device does when it is dropped.
func (v *hybridVsock) close() {
	v.mu.Lock()
	v.closed = true
	for c := range v.conns {
		c.Close()
	}
	v.mu.Unlock()
	v.ln.Close()
	v.wg.Wait()
	if err := os.Remove(v.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		v.log.Warn("vsock: remove socket", "err", err)
	}
}
