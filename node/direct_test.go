package node

import (
	"context"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/agent"
	"wb/session"
)

// startDirect starts directLoader in a host python3 (no sandbox), as a direct guest's init,
// with relay and upstream as its egress arguments, and waits until it is ready. The guest's
// environment is PATH and BASE=1, its root a temporary directory; with killable, ending the
// guest kills the python3 (else the kill does nothing, as a stop that failed).
func startDirect(t *testing.T, relay, upstream string, killable bool) (*agent.DirectGuest, *exec.Cmd) {
	t.Helper()
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3 here")
	}
	cmd := exec.Command(py, "-c", directLoader, relay, upstream)
	kill := func() {}
	if killable {
		kill = func() { _ = cmd.Process.Kill() }
	}
	d, err := agent.NewDirectGuest(t.TempDir(), []string{"PATH=/usr/bin:/bin", "BASE=1"}, kill)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	io := d.GuestStdio()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = io[0], io[1], io[2]
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.ReleaseGuestStdio()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if !d.Alive() {
		t.Fatal("Alive: a loader that waits for its frame is not alive")
	}
	return d, cmd
}

// startDirectK is startDirect with no egress relay, whose kill kills the python3.
func startDirectK(t *testing.T) *agent.DirectGuest {
	t.Helper()
	d, _ := startDirect(t, "", "", true)
	return d
}

func directExec(t *testing.T, d *agent.DirectGuest, req agent.ExecRequest, fork bool) session.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := d.Exec(ctx, req, fork, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestDirectLoaderRunsAsPythonC: a direct guest's exec answers what python3 -c CODE does:
// its output, exit code (an uncaught exception, SystemExit with a number or a message,
// os._exit), stdin, environment and working directory.
func TestDirectLoaderRunsAsPythonC(t *testing.T) {
	wd := t.TempDir()
	cases := []struct {
		name, code, stdin string
		env               map[string]string
		cwd               string
		exit              int
		stdout, stderr    string // stderr: a substring
	}{
		{name: "print", code: "print(6*7)", stdout: "42\n"},
		{name: "exit 3", code: "import sys\nprint('a')\nsys.exit(3)", exit: 3, stdout: "a\n"},
		{name: "exit message", code: "raise SystemExit('bye')", exit: 1, stderr: "bye"},
		{name: "exception", code: "1/0", exit: 1, stderr: "ZeroDivisionError"},
		{name: "os._exit", code: "import os, sys\nsys.stdout.write('x')\nsys.stdout.flush()\nos._exit(5)", exit: 5, stdout: "x"},
		{name: "exit 256", code: "import sys; sys.exit(256)", exit: 0},
		{name: "stdin", code: "import sys; print(sys.stdin.read().upper())", stdin: "hello", stdout: "HELLO\n"},
		{name: "env", code: "import os; print(os.environ['A'], os.environ['BASE'], os.environ['LANG'])", env: map[string]string{"A": "b"}, stdout: "b 1 C.UTF-8\n"},
		{name: "cwd", code: "import os; print(os.getcwd())", cwd: wd, stdout: wd + "\n"},
		{name: "argv and main", code: "import sys; print(sys.argv, __name__, sorted(k for k in globals() if not k.startswith('__')))", stdout: "['-c'] __main__ ['sys']\n"},
		{name: "atexit output", code: "import atexit; atexit.register(lambda: print('late'))", stdout: "late\n"},
		// open(0) closes the stdin it read: the status has a copy of its own.
		{name: "stdin closed", code: "print(open(0).read())", stdin: "abc", stdout: "abc\n"},
		{name: "SIGTERM", code: "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", exit: 128 + 15},
		{name: "alarm", code: "import signal, time; signal.alarm(1); time.sleep(60)", exit: 128 + 14},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := startDirectK(t)
			res := directExec(t, d, agent.ExecRequest{Argv: []string{"python3", "-c", c.code}, Stdin: []byte(c.stdin), Env: c.env, Cwd: c.cwd}, false)
			if res.ExitCode != c.exit || res.Stdout != c.stdout || !strings.Contains(res.Stderr, c.stderr) || res.TimedOut {
				t.Errorf("got exit %d, stdout %q, stderr %q (timed out %v); want exit %d, stdout %q, stderr with %q",
					res.ExitCode, res.Stdout, res.Stderr, res.TimedOut, c.exit, c.stdout, c.stderr)
			}
			if res2, err := d.Exec(context.Background(), agent.ExecRequest{Argv: []string{"python3", "-c", "pass"}}, false, 0, nil); err == nil {
				t.Errorf("a second exec in the same direct guest answered %+v; want it refused", res2)
			}
		})
	}
}

// TestDirectLoaderForkMode: an exec whose environment the interpreter reads at start runs
// its argv in a child, with that environment, and says the child's status (128+signal for a
// signal).
func TestDirectLoaderForkMode(t *testing.T) {
	d := startDirectK(t)
	res := directExec(t, d, agent.ExecRequest{Argv: []string{"python3", "-c", "import sys, os; print(sys.flags.dont_write_bytecode, os.environ['BASE']); sys.exit(4)"},
		Env: map[string]string{"PYTHONDONTWRITEBYTECODE": "1"}}, true)
	if res.ExitCode != 4 || res.Stdout != "1 1\n" {
		t.Errorf("fork mode: exit %d, stdout %q, stderr %q; want 4, \"1 1\\n\"", res.ExitCode, res.Stdout, res.Stderr)
	}
	d = startDirectK(t)
	res = directExec(t, d, agent.ExecRequest{Argv: []string{"python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"}}, true)
	if res.ExitCode != 128+15 {
		t.Errorf("fork mode, a child killed by SIGTERM: exit %d; want 143", res.ExitCode)
	}
	// As a shell starts it: SIGPIPE's default action, which Python ignores, so yes ends quietly.
	d = startDirectK(t)
	res = directExec(t, d, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "yes | head -1"}}, true)
	if res.ExitCode != 0 || res.Stdout != "y\n" || res.Stderr != "" {
		t.Errorf("fork mode, yes | head -1: exit %d, stdout %q, stderr %q; want 0, \"y\\n\", no stderr", res.ExitCode, res.Stdout, res.Stderr)
	}
	d = startDirectK(t)
	res = directExec(t, d, agent.ExecRequest{Argv: []string{"no-such-command-here", "x"}}, true)
	if res.ExitCode != 127 || !strings.Contains(res.Stderr, "no-such-command-here") {
		t.Errorf("fork mode, a command not found: exit %d, stderr %q; want 127 naming it", res.ExitCode, res.Stderr)
	}
}

// TestDirectLoaderTimeout: an exec past its timeout is killed with its guest and answers
// timed out.
func TestDirectLoaderTimeout(t *testing.T) {
	d := startDirectK(t)
	res := directExec(t, d, agent.ExecRequest{Argv: []string{"python3", "-c", "import time\nprint('started', flush=True)\ntime.sleep(600)"}, TimeoutS: 1}, false)
	if !res.TimedOut || res.ExitCode != agent.ExitTimedOut || res.Stdout != "started\n" {
		t.Errorf("got %+v; want timed out (124) with the output before it", res)
	}
}

// TestDirectLoaderRelaysEgress: the loader's relay takes connections on the proxy address and
// relays them, both ways, to the node's egress socket.
func TestDirectLoaderRelaysEgress(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				_, _ = c.Write([]byte("echo:" + string(b)))
			}()
		}
	}()
	probe, err := net.Listen("tcp", "127.0.0.1:0") // a free loopback port for the relay
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	d, _ := startDirect(t, addr, sock, true)
	code := "import socket\nc = socket.create_connection(('" + strings.ReplaceAll(addr, ":", "', ") + "))\nc.sendall(b'ping')\nc.shutdown(socket.SHUT_WR)\nb = b''\nwhile True:\n    d = c.recv(100)\n    if not d: break\n    b += d\nprint(b.decode())"
	res := directExec(t, d, agent.ExecRequest{Argv: []string{"python3", "-c", code}}, false)
	if res.ExitCode != 0 || res.Stdout != "echo:ping\n" {
		t.Errorf("through the relay: exit %d, stdout %q, stderr %q; want \"echo:ping\\n\"", res.ExitCode, res.Stdout, res.Stderr)
	}
}

// TestDirectReadyFailure: a loader that ends before it is ready is an error naming its stderr.
func TestDirectReadyFailure(t *testing.T) {
	d, err := agent.NewDirectGuest("/", nil, func() {})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cmd := exec.Command("/bin/sh", "-c", "echo no python here >&2; exit 3")
	io := d.GuestStdio()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = io[0], io[1], io[2]
	if err := cmd.Run(); err == nil {
		t.Fatal("want exit 3")
	}
	d.ReleaseGuestStdio()
	err = d.WaitReady(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no python here") {
		t.Errorf("WaitReady: %v; want the loader's stderr", err)
	}
	if d.Alive() {
		t.Error("Alive: a loader that ended is alive")
	}
}

// TestDirectExecClosedUnderIt: a direct guest's streams closed during its exec (the node
// ending its session) end the exec with an error, not with an exit code it never had.
func TestDirectExecClosedUnderIt(t *testing.T) {
	d := startDirectK(t)
	time.AfterFunc(time.Second, d.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := d.Exec(ctx, agent.ExecRequest{Argv: []string{"python3", "-c", "import time; time.sleep(60)"}}, false, 0, nil)
	if err == nil {
		t.Errorf("an exec whose streams were closed under it answered %+v; want an error", res)
	}
}

// TestDirectExecOutlivesNoFailedStop: an exec past its timeout whose guest's stop fails (the
// guest lives on, holding its streams) still ends, directKillGrace later, timed out.
func TestDirectExecOutlivesNoFailedStop(t *testing.T) {
	d, _ := startDirect(t, "", "", false)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := d.Exec(ctx, agent.ExecRequest{Argv: []string{"python3", "-c", "import time; time.sleep(600)"}, TimeoutS: 1}, false, 0, nil)
	if err != nil || !res.TimedOut || time.Since(start) > time.Minute {
		t.Errorf("an exec past its timeout whose stop failed: %+v, %v after %s; want timed out within a minute", res, err, time.Since(start).Round(time.Second))
	}
}
