package chvtest_test

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestBootAndVsock boots a guest whose init listens on vsock port 1024 and reaches it through
// CONNECT 1024; the cmdline's KEY=VALUE words are init's environment and the words after "--"
// its arguments; a port nobody listens on, or a bad command, is closed without an answer.
func TestBootAndVsock(t *testing.T) {
	f := startFake(t)
	f.boot()
	c, r := f.agent()
	defer c.Close()
	if got := ask(t, c, r, "hello"); got != "hello" {
		t.Fatalf("echo: %q", got)
	}
	env := ask(t, c, r, "env")
	for _, want := range []string{"WB_TEST=yes", "WB_VSOCK_UNIX_DIR=/run/wb-vsock", "HOME=/", "TERM=linux"} {
		if !strings.Contains(" "+env+" ", " "+want+" ") {
			t.Errorf("init's environment %q lacks %s", env, want)
		}
	}
	for _, bad := range []string{"console=", "root=", "init="} {
		if strings.Contains(env, bad) {
			t.Errorf("init's environment %q holds the kernel's %s", env, bad)
		}
	}
	if args := ask(t, c, r, "args"); args != "/sbin/guestinit agent --vsock-port 1024" {
		t.Errorf("init's argv = %q", args)
	}
	// The root is the read-only image; the writable layer is writable.
	if got := ask(t, c, r, "write /etc/x y"); !strings.Contains(got, "read-only") {
		t.Errorf("write to the root image: %q, want a read-only file system", got)
	}
	if got := ask(t, c, r, "write /workspace/x y"); got != "ok" {
		t.Errorf("write to /workspace: %q", got)
	}

	// The second connection gets the next local port, as CH allocates them.
	c2, _, line, err := vsockDial(t, f.vsock, 1024)
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	if line != "OK 1073741825\n" {
		t.Errorf("second CONNECT: %q, want OK 1073741825", line)
	}

	for _, tc := range []struct{ name, cmd string }{
		{"a port nobody listens on", "CONNECT 2000\n"},
		{"not a connect command", "HELLO 1024\n"},
		{"not a port", "CONNECT x\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("unix", f.vsock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			if _, err := io.WriteString(c, tc.cmd); err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(c)
			if err != nil || len(b) != 0 {
				t.Fatalf("answer %q, %v; want the connection closed without a word", b, err)
			}
		})
	}
	// Lower case works too (CH compares case-insensitively).
	c3, err := net.Dial("unix", f.vsock)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	_ = c3.SetDeadline(time.Now().Add(time.Minute))
	io.WriteString(c3, "connect 1024\nping\n")
	b := make([]byte, 64)
	n, _ := io.ReadAtLeast(c3, b, len("OK 1073741826\nping\n"))
	if got := string(b[:n]); got != "OK 1073741826\nping\n" {
		t.Errorf("lower-case connect with data right behind it: %q", got)
	}
}
