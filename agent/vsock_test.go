package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestVsockUnixEmulation: with WB_VSOCK_UNIX_DIR set (the test VMM's stand-in for a vsock
// device), `wb agent --vsock-port N` serves the agent's API on DIR/N.sock, and its processes
// do not inherit the variable.
func TestVsockUnixEmulation(t *testing.T) {
	dir, err := os.MkdirTemp("", "wbv") // short: sun_path holds 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	t.Setenv(VsockUnixDirEnv, dir)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--vsock-port", "1024", "--root", filepath.Join(dir, "root"), "--socket", filepath.Join(dir, "unused.sock"), "--log-level", "error"})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent returned %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("agent did not stop after its context ended")
		}
	})
	sock := filepath.Join(dir, "1024.sock")
	if got := VsockUnixSocket(dir, 1024); got != sock {
		t.Fatalf("VsockUnixSocket = %s, want %s", got, sock)
	}
	c := NewClient(sock)
	defer c.Close()
	waitHealthy(t, c, 30*time.Second)

	if _, err := os.Lstat(filepath.Join(dir, "unused.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent also listened on --socket: %v", err)
	}
	res, err := c.Exec(testCtx(t, 10*time.Second), ExecRequest{Argv: []string{"/bin/sh", "-c", "echo \"[$" + VsockUnixDirEnv + "]\""}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "[]\n" {
		t.Errorf("a guest process sees %s=%q; want it unset", VsockUnixDirEnv, res.Stdout)
	}
}

// TestVsockListen: Serve with VsockPort listens on a real AF_VSOCK port, and gives it back when
// it stops. (No connection is made: this kernel has no vsock loopback transport, and a connect
// would go to the machine's hypervisor.)
func TestVsockListen(t *testing.T) {
	probe, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no AF_VSOCK here: %v", err)
	}
	unix.Close(probe)
	// A free port: bind port "any" once and use what the kernel chose. Vsock ports are the
	// host's, shared by every container on it: another may take the port between its close
	// and Serve's bind (a cold run's did), and then a fresh one is tried.
	var port uint32
	var cancel context.CancelFunc
	var done chan error
	for attempt := 1; ; attempt++ {
		ln, err := listenVsock(unix.VMADDR_PORT_ANY)
		if err != nil {
			t.Fatal(err)
		}
		port = ln.Addr().(vsockAddr).port
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		done = make(chan error, 1)
		cfg, answer := Config{VsockPort: port, Root: t.TempDir()}, done
		go func() { answer <- Serve(ctx, cfg) }()
		if !servesOn(t, port, done, attempt < 5) {
			cancel()
			continue
		}
		break
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not stop after its context ended")
	}
	l3, err := listenVsock(port)
	if err != nil {
		t.Fatalf("the port is still taken after Serve returned: %v", err)
	}
	l3.Close()
}

// TestVsockListenerClose: Close wakes a blocked Accept with net.ErrClosed (http.Server's
// signal of a normal shutdown).
func TestVsockListenerClose(t *testing.T) {
	ln, err := listenVsock(unix.VMADDR_PORT_ANY)
	if err != nil {
		t.Skipf("no AF_VSOCK here: %v", err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if c != nil {
			c.Close()
		}
		accepted <- err
	}()
	select {
	case err := <-accepted:
		t.Fatalf("Accept returned before Close: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	ln.Close()
	select {
	case err := <-accepted:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake Accept")
	}
}

// TestVsockListenerServesHTTP: the listener's accept loop and connections carry HTTP, with
// the server's deadlines, until Shutdown. A Unix socket stands in for AF_VSOCK (no vsock
// peer can connect here): the wrapper is the same for any stream socket.
func TestVsockListenerServesHTTP(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "wbv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "s")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		t.Fatal(err)
	}
	ln := newVsockListener(fd, vsockAddr{cid: 3, port: 1024})
	if ln.Addr().String() != "vsock:3:1024" {
		t.Errorf("Addr = %s", ln.Addr())
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "got %s", body)
		}),
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}
	for i := range 3 { // fresh and reused connections
		resp, err := hc.Post("http://vsock/", "text/plain", strings.NewReader(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != fmt.Sprintf("got %d", i) {
			t.Errorf("response %q", b)
		}
	}
	hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve after Shutdown = %v, want ErrServerClosed", err)
	}
}

func TestVsockPortFlag(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"4294967296", "-1", "x"} {
		if err := run(context.Background(), []string{"--vsock-port", bad}); err == nil || !strings.Contains(err.Error(), "vsock-port") {
			t.Errorf("--vsock-port %s: %v", bad, err)
		}
	}
}

// servesOn waits until Serve (whose answer comes on done) holds vsock port, and reports
// whether it does; false when Serve found the port taken and retry allows another.
func servesOn(t *testing.T, port uint32, done chan error, retry bool) bool {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l2, err := listenVsock(port)
		if err != nil {
			if !errors.Is(err, unix.EADDRINUSE) {
				t.Fatalf("second listen on port %d: %v, want EADDRINUSE", port, err)
			}
			return true
		}
		l2.Close()
		if time.Now().After(deadline) {
			t.Fatalf("Serve never listened on vsock port %d", port)
		}
		select {
		case err := <-done:
			if retry && errors.Is(err, unix.EADDRINUSE) {
				return false
			}
			t.Fatalf("Serve returned %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}

}
