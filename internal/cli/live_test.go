//go:build linux

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"wb/client"
	"wb/internal/servetest"
)

// live is a wb serve and the environment that points the CLI at it.
type live struct {
	srv *servetest.Server
	env env
}

// wb runs the CLI in-process on buffers and answers its stdout, stderr and error.
func (l *live) wb(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	a, out, errb := newTestApp(l.env, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := a.run(ctx, args)
	return out.String(), errb.String(), err
}

// must runs the CLI and fails the test on an error.
func (l *live) must(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := l.wb(t, args...)
	if err != nil {
		t.Fatalf("wb %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// jsonOf runs the CLI with -o json and decodes its stdout into v.
func (l *live) jsonOf(t *testing.T, v any, args ...string) {
	t.Helper()
	out := l.must(t, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("wb %s -o json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// bin runs the wb binary (main's exit codes) and answers stdout, stderr and its exit code.
func (l *live) bin(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(l.srv.Bin, args...)
	cmd.Env = append(os.Environ(), "WB_URL="+l.srv.URL, "WB_API_KEY="+l.srv.APIKey, "HOME="+t.TempDir())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run wb %v: %v", args, err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// rowOf answers the table row whose first cell is id, split into cells.
func rowOf(t *testing.T, table, id string) []string {
	t.Helper()
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == id {
			return f
		}
	}
	t.Fatalf("no row %s in:\n%s", id, table)
	return nil
}

// TestLive drives every command against a real `wb serve` with runc guests: the tables and
// JSON they print, their errors and exit codes.
func TestLive(t *testing.T) {
	if testing.Short() {
		t.Skip("starts wb serve with real guests")
	}
	srv := servetest.Start(t, "--allow-private-webhooks")
	l := &live{srv: srv, env: env{"WB_URL": srv.URL, "WB_API_KEY": srv.APIKey, "HOME": t.TempDir()}}
	defer func() {
		if t.Failed() {
			t.Logf("wb serve's log:\n%s", srv.Log())
		}
	}()

	// create waits for running, showing progress on a terminal's stderr only.
	a, out, errb := newTestApp(l.env, "")
	a.progress = true
	if err := a.run(context.Background(), []string{"sessions", "create", "--tier", "2", "-m", "cli=yes"}); err != nil {
		t.Fatalf("sessions create: %v\n%s", err, errb.String())
	}
	if !strings.HasPrefix(out.String(), "ID ") || !strings.Contains(errb.String(), ": running (") {
		t.Fatalf("create: stdout %q, progress %q", out.String(), errb.String())
	}
	id := strings.Fields(strings.Split(out.String(), "\n")[1])[0]
	if row := rowOf(t, out.String(), id); row[1] != "2" || row[2] != "running" || !strings.HasPrefix(id, "sess_") {
		t.Fatalf("create row %v", row)
	}
	defer l.wb(t, "sessions", "rm", id)

	t.Run("ls and get", func(t *testing.T) {
		if row := rowOf(t, l.must(t, "sessions", "ls", "--state", "running"), id); row[2] != "running" {
			t.Errorf("ls row %v", row)
		}
		var ss []client.Session
		l.jsonOf(t, &ss, "sessions", "ls")
		if len(ss) == 0 || ss[0].ID != id || ss[0].Metadata["cli"] != "yes" {
			t.Errorf("ls -o json: %+v", ss)
		}
		var s client.Session
		l.jsonOf(t, &s, "sessions", "get", id)
		if s.ID != id || s.Object != "session" || s.State != "running" {
			t.Errorf("get -o json: %+v", s)
		}
	})

	t.Run("completion of session ids", func(t *testing.T) {
		out := l.must(t, "__complete", "sessions", "exec", "")
		if !strings.Contains(out, id+"\trunning tpl_base") {
			t.Errorf("__complete sessions exec lacks %s:\n%s", id, out)
		}
	})

	t.Run("errors", func(t *testing.T) {
		_, _, err := l.wb(t, "sessions", "create", "--tier", "9")
		if err == nil || !strings.Contains(err.Error(), "(param tier)") || !strings.Contains(err.Error(), "400 invalid_request") {
			t.Errorf("create --tier 9: %v", err)
		}
		_, stderr, code := l.bin(t, "sessions", "get", "sess_doesnotexist")
		if code != 2 || !strings.Contains(stderr, "404 not_found") {
			t.Errorf("get of an unknown session: exit %d, stderr %q", code, stderr)
		}
	})

	t.Run("exec", func(t *testing.T) {
		stdout, stderr, code := l.bin(t, "sessions", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
		if code != 7 || stdout != "out\n" || stderr != "err\n" {
			t.Errorf("exec exit 7: code %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		if stdout, _, code := l.bin(t, "sessions", "exec", id, "--", "echo hello; exit 0"); code != 0 || stdout != "hello\n" {
			t.Errorf("exec via sh -c: code %d, stdout %q", code, stdout)
		}
		// Output streams: the first line shows while the command still runs.
		first := make(chan struct{})
		a, _, _ := newTestApp(l.env, "")
		a.Out = writerFunc(func(b []byte) (int, error) {
			if bytes.Contains(b, []byte("first")) {
				close(first)
			}
			return len(b), nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.run(ctx, []string{"sessions", "exec", id, "--", "echo first; sleep 120"}) }()
		select {
		case <-first:
		case err := <-done:
			t.Fatalf("exec ended (%v) before streaming its first line", err)
		case <-time.After(time.Minute):
			t.Fatal("exec streamed nothing within a minute of a command that printed at once")
		}
		cancel()
		<-done

		a, out, _ := newTestApp(l.env, "from stdin")
		if err := a.run(context.Background(), []string{"sessions", "exec", id, "--stdin", "--", "cat"}); err != nil || out.String() != "from stdin" {
			t.Errorf("exec --stdin: %v, %q", err, out.String())
		}
		var r client.ExecResult
		out2, _, err := l.wb(t, "sessions", "exec", id, "-o", "json", "--", "sh", "-c", "echo j; exit 3")
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != 3 || json.Unmarshal([]byte(out2), &r) != nil || r.ExitCode != 3 || r.Stdout != "j\n" {
			t.Errorf("exec -o json: %v, %q", err, out2)
		}
	})

	t.Run("runs", func(t *testing.T) {
		out, _, err := l.wb(t, "runs", "create", "--session", id, "--", "sh", "-c", "echo ran; exit 4")
		var ee *ExitError
		if !errors.As(err, &ee) || ee.Code != 4 || !strings.Contains(out, "\nran\n") {
			t.Fatalf("runs create: %v, %q", err, out)
		}
		runID := strings.Fields(strings.Split(out, "\n")[1])[0]
		if row := rowOf(t, out, runID); row[2] != "failed" && row[2] != "succeeded" || row[3] != "4" {
			t.Errorf("run row %v", row)
		}
		var r client.Run
		l.jsonOf(t, &r, "runs", "get", runID)
		if r.ID != runID || deref(r.ExitCode) != 4 {
			t.Errorf("runs get: %+v", r)
		}
	})

	// The templates list the runtimes with their versions, and the help's example of an
	// ephemeral run (--runtime python) runs.
	t.Run("templates and ephemeral runs", func(t *testing.T) {
		row := rowOf(t, l.must(t, "templates", "ls"), "tpl_dev_polyglot")
		if !strings.Contains(strings.Join(row, " "), "python3 3.") {
			t.Errorf("templates ls: tpl_dev_polyglot's row %v; want python3 with its version", row)
		}
		var ts []client.Template
		l.jsonOf(t, &ts, "templates", "ls")
		if i := slices.IndexFunc(ts, func(tp client.Template) bool { return tp.Name == "tpl_dev_polyglot" }); i < 0 || ts[i].RuntimeVersions["python3"] == "" {
			t.Errorf("templates ls -o json: %+v", ts)
		}
		out, _, err := l.wb(t, "runs", "create", "--runtime", "python", "--code", "print(6*7)")
		if err != nil || !strings.Contains(out, "\n42\n") {
			t.Errorf("runs create --runtime python: %v, %q", err, out)
		}
	})

	t.Run("pause resume", func(t *testing.T) {
		if row := rowOf(t, l.must(t, "sessions", "pause", id), id); row[2] != "paused" {
			t.Errorf("pause row %v", row)
		}
		if row := rowOf(t, l.must(t, "sessions", "resume", id), id); row[2] != "running" {
			t.Errorf("resume row %v", row)
		}
	})

	t.Run("snapshot", func(t *testing.T) {
		a, out, errb := newTestApp(l.env, "")
		a.progress = true
		if err := a.run(context.Background(), []string{"sessions", "snapshot", id}); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		snapID := strings.Fields(strings.Split(out.String(), "\n")[1])[0]
		if row := rowOf(t, out.String(), snapID); row[1] != id || row[2] != "ready" || !strings.Contains(errb.String(), "snapshotting") {
			t.Fatalf("snapshot row %v, progress %q", row, errb.String())
		}
		var snaps []client.Snapshot
		l.jsonOf(t, &snaps, "snapshots", "ls")
		if len(snaps) != 1 || snaps[0].ID != snapID {
			t.Errorf("snapshots ls: %+v", snaps)
		}
		if row := rowOf(t, l.must(t, "snapshots", "rm", snapID), snapID); row[2] != "true" {
			t.Errorf("snapshots rm row %v", row)
		}
		if out := l.must(t, "snapshots", "ls"); strings.Contains(out, snapID) {
			t.Errorf("snapshot listed after rm:\n%s", out)
		}
	})

	t.Run("pty", func(t *testing.T) { testPTY(t, l, id) })
	t.Run("pty in tmux", func(t *testing.T) { testPTYInTmux(t, l, id) })

	t.Run("policies", func(t *testing.T) {
		dir := t.TempDir()
		file := filepath.Join(dir, "guard.rego")
		_ = os.WriteFile(file, []byte("package wb.admission\n\ndeny contains \"blocked\" if input.request.metadata.block == \"yes\"\n"), 0o644)
		if row := rowOf(t, l.must(t, "policies", "push", file, "--mode", "warn"), "pol_guard@1"); row[1] != "guard" || row[3] != "warn" || row[4] != "admission" {
			t.Errorf("push row %v", row)
		}
		l.must(t, "policies", "push", file)
		var ps []client.Policy
		l.jsonOf(t, &ps, "policies", "ls")
		if len(ps) != 1 || ps[0].Version != 2 || ps[0].Mode != "enforce" {
			t.Errorf("policies ls: %+v", ps)
		}
		if out := l.must(t, "policies", "ls", "guard"); !strings.Contains(out, "pol_guard@1") || !strings.Contains(out, "pol_guard@2") {
			t.Errorf("policies ls guard:\n%s", out)
		}
		_ = os.WriteFile(file, []byte("package wb.admission\n\ndeny contains x if {\n"), 0o644)
		if _, _, err := l.wb(t, "policies", "push", file); err == nil || !strings.Contains(err.Error(), "400") {
			t.Errorf("push of a broken policy: %v", err)
		}
		if row := rowOf(t, l.must(t, "policies", "rm", "guard"), "guard"); row[2] != "true" {
			t.Errorf("policies rm row %v", row)
		}
		if _, _, err := l.wb(t, "policies", "rm", "guard"); err == nil || !strings.Contains(err.Error(), "404") {
			t.Errorf("rm of a deleted policy: %v", err)
		}
	})

	t.Run("plugins", func(t *testing.T) {
		wasm := buildPlugin(t)
		if row := rowOf(t, l.must(t, "plugins", "push", wasm, "--name", "tc", "--points", "admission", "--order", "3", "--fail-open"), "tc"); row[1] != "admission" || row[2] != "3" || row[3] != "true" {
			t.Errorf("push row %v", row)
		}
		var ps []client.Plugin
		l.jsonOf(t, &ps, "plugins", "ls")
		if len(ps) != 1 || ps[0].Name != "tc" || !ps[0].FailOpen {
			t.Errorf("plugins ls: %+v", ps)
		}
		l.must(t, "plugins", "get", "tc")
		l.must(t, "plugins", "rm", "tc")
		if out := l.must(t, "plugins", "ls"); strings.Contains(out, "tc ") {
			t.Errorf("plugin listed after rm:\n%s", out)
		}
	})

	t.Run("usage", func(t *testing.T) {
		var u client.Usage
		l.jsonOf(t, &u, "usage")
		if u.Object != "usage" {
			t.Errorf("usage -o json: %+v", u)
		}
		if out := l.must(t, "usage", "--group-by", "end_user"); !strings.HasPrefix(out, "END USER") || !strings.Contains(out, "TOTAL") {
			t.Errorf("usage table:\n%s", out)
		}
	})

	t.Run("webhooks", func(t *testing.T) {
		var e client.WebhookEndpointCreated
		l.jsonOf(t, &e, "webhooks", "create", "http://127.0.0.1:9/hook", "--events", "session.running,session.stopped")
		if !strings.HasPrefix(e.ID, "whe_") || !strings.HasPrefix(e.Secret, "whsec_") || len(e.Events) != 2 {
			t.Fatalf("webhooks create: %+v", e)
		}
		if row := rowOf(t, l.must(t, "webhooks", "ls"), e.ID); row[1] != "http://127.0.0.1:9/hook" || row[2] != "session.running,session.stopped" {
			t.Errorf("webhooks ls row %v", row)
		}
		l.must(t, "webhooks", "get", e.ID)
		if out := l.must(t, "webhooks", "deliveries", e.ID); !strings.HasPrefix(out, "ID ") {
			t.Errorf("deliveries:\n%s", out)
		}
		if row := rowOf(t, l.must(t, "webhooks", "rm", e.ID), e.ID); row[2] != "true" {
			t.Errorf("rm row %v", row)
		}
	})

	t.Run("desktops", func(t *testing.T) {
		var d client.Desktop
		l.jsonOf(t, &d, "desktops", "create", "cli-desk")
		if !strings.HasPrefix(d.ID, "desk_") || d.Name != "cli-desk" {
			t.Fatalf("desktops create: %+v", d)
		}
		if row := rowOf(t, l.must(t, "desktops", "ls"), d.ID); row[1] != "cli-desk" {
			t.Errorf("desktops ls row %v", row)
		}
		// Await running, then each move: stop, start, sleep, wake, resize.
		await := func(states ...string) client.Desktop {
			t.Helper()
			deadline := time.Now().Add(3 * time.Minute)
			for {
				var got client.Desktop
				l.jsonOf(t, &got, "desktops", "get", d.ID)
				for _, s := range states {
					if string(got.State) == s {
						return got
					}
				}
				if got.State == "failed" || time.Now().After(deadline) {
					t.Fatalf("desktop %s is %s (%s), want %v", d.ID, got.State, got.Message, states)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		await("running")
		l.must(t, "desktops", "stop", d.ID)
		await("stopped")
		if row := rowOf(t, l.must(t, "desktops", "resize", d.ID, "m"), d.ID); row[2] != "m" {
			t.Errorf("resize row %v", row)
		}
		l.must(t, "desktops", "start", d.ID)
		await("running")
		l.must(t, "desktops", "sleep", d.ID)
		await("asleep")
		l.must(t, "desktops", "wake", d.ID)
		await("running")
		if row := rowOf(t, l.must(t, "desktops", "rm", d.ID), d.ID); row[2] != "true" {
			t.Errorf("rm row %v", row)
		}
	})

	t.Run("profiles", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "config")
		_ = os.WriteFile(path, []byte("[live]\nurl = "+srv.URL+"\napi_key = "+srv.APIKey+"\n\n[default]\nurl = "+srv.URL+"\napi_key = wb_wrong\n"), 0o600)
		base := env{"WB_CONFIG": path}
		for _, c := range []struct {
			name string
			env  env
			args []string
			ok   bool
		}{
			{"--profile", base, []string{"--profile", "live"}, true},
			{"WB_PROFILE", env{"WB_CONFIG": path, "WB_PROFILE": "live"}, nil, true},
			{"default profile", base, nil, false},
			{"env over default profile", env{"WB_CONFIG": path, "WB_API_KEY": srv.APIKey}, nil, true},
			{"--profile over env", env{"WB_CONFIG": path, "WB_URL": srv.URL, "WB_API_KEY": "wb_wrong"}, []string{"--profile", "live"}, true},
			{"--api-key over --profile", base, []string{"--profile", "live", "--api-key", "wb_wrong"}, false},
		} {
			pl := &live{srv: srv, env: c.env}
			_, _, err := pl.wb(t, append(c.args, "sessions", "ls")...)
			if c.ok && err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			if !c.ok && (err == nil || !strings.Contains(err.Error(), "401")) {
				t.Errorf("%s: %v, want a 401 (the wrong key was used)", c.name, err)
			}
		}
	})

	if row := rowOf(t, l.must(t, "sessions", "rm", id), id); row[2] != "stopping" && row[2] != "stopped" {
		t.Errorf("rm row %v", row)
	}
}

// buildPlugin builds the tiercap example plugin.
func buildPlugin(t *testing.T) string {
	t.Helper()
	wasm := filepath.Join(t.TempDir(), "tiercap.wasm")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildmode=c-shared", "-o", wasm, "../../plugins/examples/tiercap")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the plugin: %v\n%s", err, out)
	}
	return wasm
}

// ptyScreen collects what the CLI prints on its terminal.
type ptyScreen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *ptyScreen) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(b)
}

func (s *ptyScreen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// testPTY runs `wb pty` on a real pseudo-terminal: a command's output comes back, a resize of
// the local terminal reaches the guest (stty size), Ctrl-C reaches the guest (raw mode), and
// `exit 3` is the CLI's exit code.
func testPTY(t *testing.T, l *live, id string) {
	cmd := exec.Command(l.srv.Bin, "pty", id)
	cmd.Env = append(os.Environ(), "WB_URL="+l.srv.URL, "WB_API_KEY="+l.srv.APIKey, "HOME="+t.TempDir())
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	screen := &ptyScreen{}
	go func() { _, _ = io.Copy(screen, tty) }()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	}()
	// awaitRe types line every few seconds until the screen matches re (the shell may not
	// have started, or the resize not arrived, when it is first typed).
	awaitRe := func(line string, re *regexp.Regexp) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !re.MatchString(screen.String()) {
			if _, err := tty.Write([]byte(line + "\r")); err != nil {
				t.Fatalf("type %q: %v", line, err)
			}
			for wait := time.Now().Add(3 * time.Second); time.Now().Before(wait) && !re.MatchString(screen.String()); {
				select {
				case err := <-exited:
					t.Fatalf("wb pty exited (%v) before %s; screen:\n%q", err, re, screen.String())
				case <-time.After(50 * time.Millisecond):
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s within a minute; screen:\n%q", re, screen.String())
			}
		}
	}
	awaitRe("echo hel''lo", regexp.MustCompile(`hello\r\n`))
	awaitRe("stty size", regexp.MustCompile(`(?m)^24 80\r$`))
	if err := pty.Setsize(tty, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	awaitRe("stty size", regexp.MustCompile(`(?m)^40 100\r$`))
	// Raw mode: Ctrl-C is a key for the guest (it ends the remote sleep), not a signal to wb.
	if _, err := tty.Write([]byte("sleep 300\r")); err != nil {
		t.Fatal(err)
	}
	awaitRe("\x03echo int''ok", regexp.MustCompile(`intok\r\n`))
	if _, err := tty.Write([]byte("exit 3\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if code := cmd.ProcessState.ExitCode(); code != 3 {
			t.Fatalf("wb pty exited %d, want the shell's 3; screen:\n%q", code, screen.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("wb pty did not end within a minute of exit 3; screen:\n%q", screen.String())
	}
}

// testPTYInTmux drives `wb pty` in a tmux pane, as a person would: a typed command's output
// shows in the pane, resizing the window reaches the guest (stty size), and the shell's exit
// code is wb's.
func testPTYInTmux(t *testing.T, l *live, id string) {
	tmuxBin, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed")
	}
	dir, err := os.MkdirTemp("", "wbtmux") // short: the server's socket path must fit in 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock, exitFile := filepath.Join(dir, "s"), filepath.Join(dir, "exit")
	tmux := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(tmuxBin, append([]string{"-S", sock, "-f", "/dev/null"}, args...)...)
		cmd.Env = append(os.Environ(), "TERM=xterm-256color")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	shell := fmt.Sprintf("env WB_URL=%s WB_API_KEY=%s %s pty %s; echo $? > %s", l.srv.URL, l.srv.APIKey, l.srv.Bin, id, exitFile)
	tmux("new-session", "-d", "-s", "wb", "-x", "80", "-y", "24", shell)
	t.Cleanup(func() { _ = exec.Command(tmuxBin, "-S", sock, "kill-server").Run() })
	// await types keys (again every few seconds: the shell may not be up, or the resize not
	// through) until the pane shows re.
	await := func(keys string, re *regexp.Regexp) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			tmux("send-keys", "-t", "wb", "-l", keys)
			tmux("send-keys", "-t", "wb", "Enter")
			for wait := time.Now().Add(3 * time.Second); time.Now().Before(wait); time.Sleep(100 * time.Millisecond) {
				if re.MatchString(tmux("capture-pane", "-p", "-t", "wb")) {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the pane shows no %s within a minute:\n%s", re, tmux("capture-pane", "-p", "-t", "wb"))
			}
		}
	}
	await("echo tm''ux", regexp.MustCompile(`(?m)^tmux$`))
	await("stty size", regexp.MustCompile(`(?m)^24 80$`))
	tmux("resize-window", "-t", "wb", "-x", "100", "-y", "40")
	await("stty size", regexp.MustCompile(`(?m)^40 100$`))
	tmux("send-keys", "-t", "wb", "-l", "exit 3")
	tmux("send-keys", "-t", "wb", "Enter")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if b, _ := os.ReadFile(exitFile); strings.TrimSpace(string(b)) != "" {
			if got := strings.TrimSpace(string(b)); got != "3" {
				t.Fatalf("wb pty in tmux exited %s, want the shell's 3", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("wb pty did not end within a minute of exit 3:\n%s", tmux("capture-pane", "-p", "-t", "wb"))
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
