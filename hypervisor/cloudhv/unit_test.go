package cloudhv

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/internal/guestfile"
	"wb/internal/proc"
)

func TestKernelCmdline(t *testing.T) {
	s := hypervisor.Spec{
		Args: []string{hypervisor.GuestAgentBin, "agent", "--socket", "/run/wb/agent.sock", "--root", "/workspace",
			"--egress-listen", "127.0.0.1:3128", "--egress-socket=/run/wb/egress.sock"},
		Env: []string{"PATH=/bin", "HOME=/root", "HTTP_PROXY=http://127.0.0.1:3128"},
	}
	got, err := kernelCmdline(s)
	if err != nil {
		t.Fatal(err)
	}
	// ip=: the guest's address on its tap (10.0.0.2/30, gateway the host end), as Linux's
	// IP autoconfiguration reads it.
	want := "console=hvc0 root=/dev/vda ro sysctl.vm.panic_on_oom=1 ip=10.0.0.2::10.0.0.1:255.255.255.252::eth0:off init=/run/wb-bin/wb PATH=/bin HOME=/root HTTP_PROXY=http://127.0.0.1:3128 -- agent --vsock-port 1024 --root /workspace"
	if got != want {
		t.Errorf("cmdline\n got %q\nwant %q", got, want)
	}
	s.Env = nil
	if got, _ := kernelCmdline(s); !strings.Contains(got, " PATH=/usr/local/sbin:") {
		t.Errorf("no default PATH: %q", got)
	}
	for _, bad := range []struct {
		env  []string
		args []string
		want string
	}{
		{env: []string{"A=b c"}, want: "env A"},
		{env: []string{`A="x"`}, want: "env A"},
		{env: []string{"a.b=1"}, want: "module parameter"},
		{env: []string{"console=ttyS0"}, want: "for itself"},
		{env: []string{"NOVALUE"}, want: "KEY=VALUE"},
		{args: []string{"/sbin/init", "two words"}, want: "init argument"},
		{args: []string{"/sbin/init", "--"}, want: "separates"},
		{args: []string{"relative"}, want: "absolute"},
		{env: []string{"A=" + strings.Repeat("x", 2100)}, want: "2047"},
		{env: strings.Split(strings.Repeat("A=1,", 31), ",")[:31], want: "at most 30"},
	} {
		s := hypervisor.Spec{Args: []string{"/sbin/init"}, Env: bad.env}
		if bad.args != nil {
			s.Args = bad.args
		}
		if _, err := kernelCmdline(s); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("env %.40q args %q: %v; want an error saying %q", bad.env, bad.args, err, bad.want)
		}
	}
}

func TestAgentArgs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"agent --socket /x", "agent --vsock-port 1024"},
		{"agent --socket=/x --root /w", "agent --vsock-port 1024 --root /w"},
		{"agent --root /w", "agent --root /w --vsock-port 1024"},
		{"agent --vsock-port 7", "agent --vsock-port 7"},
	} {
		got := strings.Join(agentArgs(append([]string{hypervisor.GuestAgentBin}, strings.Fields(tc.in)...)), " ")
		if got != tc.want {
			t.Errorf("%q → %q; want %q", tc.in, got, tc.want)
		}
	}
	if got := agentArgs([]string{"/bin/sh", "-c", "--socket"}); strings.Join(got, " ") != "-c --socket" {
		t.Errorf("another init's args were changed: %q", got)
	}
}

// vsockServer answers each connection's first line with reply (then extra), recording the line.
func vsockServer(t *testing.T, reply string) (string, <-chan string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "v.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lines := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 64)
		n, _ := c.Read(b)
		lines <- string(b[:n])
		_, _ = io.WriteString(c, reply)
		_, _ = io.Copy(io.Discard, c)
	}()
	return sock, lines
}

func TestDialVsock(t *testing.T) {
	ctx := context.Background()
	sock, lines := vsockServer(t, "OK 1073741824\nfirst bytes")
	c, err := dialVsock(ctx, sock, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if l := <-lines; l != "CONNECT 1024\n" {
		t.Errorf("sent %q", l)
	}
	b := make([]byte, 11)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second)) // a lost prefix must fail, not hang
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "first bytes" {
		t.Errorf("bytes after the OK line: %q, %v", b, err)
	}
	for _, reply := range []string{"", "NO\n", "OK x\n", strings.Repeat("O", 40)} {
		sock, _ := vsockServer(t, reply)
		if c, err := dialVsock(ctx, sock, 1024); err == nil {
			c.Close()
			t.Errorf("reply %q accepted", reply)
		}
	}
	// A VM that never answers (paused): the caller's deadline ends the wait.
	sock = filepath.Join(t.TempDir(), "mute.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			time.Sleep(5 * time.Second)
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := dialVsock(dctx, sock, 1024); err == nil || time.Since(t0) > 3*time.Second {
		t.Errorf("a mute VMM: %v after %v", err, time.Since(t0))
	}
}

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("head"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("tail"), 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(128 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := copySparse(src, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if string(a) != string(b) {
		t.Fatal("the copy differs")
	}
	if got := guestfile.Allocated(dst); got <= 0 || got > 1<<20 {
		t.Errorf("the copy takes %d bytes; want it sparse (a few KiB)", got)
	}
}

// TestInfoOfAVMMLeaving: a VMM that still runs but has closed its API (after vmm.shutdown,
// on its way out) runs no guest: Info says stopped rather than failing, so that a teardown in
// progress does not read as a guest that still runs.
func TestInfoOfAVMMLeaving(t *testing.T) {
	d := &Driver{o: Options{StateDir: t.TempDir()}}
	start, ok := proc.Start(os.Getpid())
	if !ok {
		t.Fatal("no start time for this process")
	}
	for name, leave := range map[string]func(sock string) error{
		"socket removed": func(string) error { return nil },
		"socket without a listener": func(sock string) error {
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
			if err != nil {
				return err
			}
			ln.SetUnlinkOnClose(false)
			return ln.Close()
		},
	} {
		t.Run(name, func(t *testing.T) {
			id := "sess_" + strings.ReplaceAll(name, " ", "")
			if err := os.MkdirAll(d.GuestDir(id), 0o700); err != nil {
				t.Fatal(err)
			}
			// This test's own process stands in for the VMM: alive, with no API.
			if err := writeJSON(filepath.Join(d.GuestDir(id), recordFile), record{Pid: os.Getpid(), Start: start}); err != nil {
				t.Fatal(err)
			}
			if err := leave(filepath.Join(d.GuestDir(id), apiSocket)); err != nil {
				t.Fatal(err)
			}
			info, err := d.Info(context.Background(), id)
			if err != nil || info.State != hypervisor.StateStopped {
				t.Fatalf("Info = %+v, %v; want %s", info, err, hypervisor.StateStopped)
			}
		})
	}
}

// TestWaitAPISlowVMM: a VMM whose API takes longer than a ping's first bound to answer is
// still heard. With a fixed one-second bound, every ping of such a VMM was cancelled and the
// guest's start waited until its deadline.
func TestWaitAPISlowVMM(t *testing.T) {
	d := &Driver{o: Options{StateDir: t.TempDir()}}
	const id, delay = "sess_slowapi", 1500 * time.Millisecond
	if err := os.MkdirAll(d.GuestDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(d.GuestDir(id), apiSocket))
	if err != nil {
		t.Fatal(err)
	}
	var pings atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/vmm.ping" {
			http.NotFound(w, r)
			return
		}
		pings.Add(1)
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"version":"v48.0"}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := d.waitAPI(ctx, record{Spec: hypervisor.Spec{ID: id}}, nil); err != nil {
		t.Fatalf("after %s and %d pings: %v", time.Since(start).Round(time.Millisecond), pings.Load(), err)
	}
	t.Logf("answered after %s, %d pings", time.Since(start).Round(time.Millisecond), pings.Load())
}
