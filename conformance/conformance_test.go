package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestConformance runs the whole contract against every deployment, one subtest each. The
// groups run in parallel; once all are done the deployment must hold no live session.
func TestConformance(t *testing.T) {
	forEach(t, func(t *testing.T, d *deployment) {
		t.Run("contract", func(t *testing.T) {
			for _, g := range []struct {
				name string
				f    func(*testing.T, *deployment)
			}{
				{"Exec", testExec},
				{"ExecStream", testExecStream},
				{"PTY", testPTY},
				{"Isolation", testIsolation},
				{"PauseResume", testPauseResume},
				{"Snapshot", testSnapshot},
				{"Files", testFiles},
				{"Runs", testRuns},
				{"Templates", testTemplates},
				{"ClientDisconnect", testClientDisconnect},
			} {
				t.Run(g.name, func(t *testing.T) {
					t.Parallel()
					g.f(t, d)
				})
			}
		})
		t.Run("NoSlotLeak", func(t *testing.T) { testNoSlotLeak(t, d) })
		t.Run("SecondServerSameHost", func(t *testing.T) { testSecondServer(t, d) })
	})
}

func testExec(t *testing.T, d *deployment) {
	s := d.newSession(t, nil)
	id := s.ID
	t.Run("echo", func(t *testing.T) {
		res := d.exec(t, id, map[string]any{"command": "echo hi"})
		if res.Stdout != "hi\n" || res.ExitCode != 0 || res.Stderr != "" || res.TimedOut {
			t.Errorf(`exec "echo hi": want stdout "hi\n", exit 0, no stderr; got %+v`, res)
		}
	})
	// Every exec of a healthy running session must succeed: no 502 for a trivial command.
	t.Run("reliability", func(t *testing.T) {
		const n = 150
		var failed []string
		for i := range n {
			r := d.call(t, "POST", "/v1/sessions/"+id+"/exec", map[string]any{"command": fmt.Sprintf("echo %d", i)})
			var res execResult
			_ = json.Unmarshal(r.body, &res)
			if r.status != 200 || res.Stdout != fmt.Sprintf("%d\n", i) {
				failed = append(failed, fmt.Sprintf("#%d: %s", i, r))
			}
		}
		if len(failed) > 0 {
			t.Errorf("%d of %d sequential execs of \"echo N\" in one running session failed; first: %s", len(failed), n, failed[0])
		}
	})
	t.Run("argv", func(t *testing.T) {
		res := d.exec(t, id, map[string]any{"command": []string{"printf", "%s|", "a b", "$HOME"}})
		if res.Stdout != "a b|$HOME|" || res.ExitCode != 0 {
			t.Errorf(`exec argv [printf %%s| "a b" $HOME]: want stdout "a b|$HOME|" (no shell), exit 0; got %+v`, res)
		}
	})
	t.Run("exit_codes", func(t *testing.T) {
		for _, c := range []int{0, 1, 2, 42, 255} {
			res := d.exec(t, id, map[string]any{"command": fmt.Sprintf("exit %d", c)})
			if res.ExitCode != c {
				t.Errorf("exec \"exit %d\": exit_code %d", c, res.ExitCode)
			}
		}
		res := d.exec(t, id, map[string]any{"command": "/no/such/binary"})
		if res.ExitCode != 127 {
			t.Errorf("exec of a missing binary: exit_code %d, want 127 (stderr %q)", res.ExitCode, res.Stderr)
		}
	})
	t.Run("stderr", func(t *testing.T) {
		res := d.exec(t, id, map[string]any{"command": "echo out; echo err >&2; exit 3"})
		if res.Stdout != "out\n" || res.Stderr != "err\n" || res.ExitCode != 3 {
			t.Errorf(`want stdout "out\n", stderr "err\n", exit 3; got %+v`, res)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		res := d.exec(t, id, map[string]any{"command": "tr a-z A-Z", "stdin": "hello\nworld\n"})
		if res.Stdout != "HELLO\nWORLD\n" || res.ExitCode != 0 {
			t.Errorf(`stdin "hello\nworld\n" through "tr a-z A-Z": got %+v`, res)
		}
		res = d.exec(t, id, map[string]any{"command": "wc -c"})
		if strings.TrimSpace(res.Stdout) != "0" {
			t.Errorf("without stdin, wc -c should read EOF at once and print 0; got %+v", res)
		}
	})
	t.Run("env", func(t *testing.T) {
		res := d.exec(t, id, map[string]any{"command": `printf '%s|%s' "$FOO" "$BAR"`, "env": map[string]string{"FOO": "foo value", "BAR": "b=c"}})
		if res.Stdout != "foo value|b=c" {
			t.Errorf(`env {FOO:"foo value", BAR:"b=c"}: got stdout %q (stderr %q)`, res.Stdout, res.Stderr)
		}
	})
	t.Run("cwd", func(t *testing.T) {
		d.sh(t, id, "mkdir -p /workspace/sub/dir")
		res := d.exec(t, id, map[string]any{"command": "pwd", "cwd": "/workspace/sub/dir"})
		if res.Stdout != "/workspace/sub/dir\n" {
			t.Errorf("cwd /workspace/sub/dir: pwd printed %q (stderr %q, exit %d)", res.Stdout, res.Stderr, res.ExitCode)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		res := d.exec(t, id, map[string]any{"command": "sleep 30", "timeout_s": 1})
		el := time.Since(start)
		if !res.TimedOut {
			t.Errorf("sleep 30 with timeout_s 1: timed_out false (%+v)", res)
		}
		if res.ExitCode == 0 {
			t.Errorf("sleep 30 with timeout_s 1: exit_code 0")
		}
		if el > 5*time.Second {
			t.Errorf("sleep 30 with timeout_s 1 answered after %s, want within a few seconds", el)
		}
		// The session is still usable.
		if out := d.sh(t, id, "echo after"); out != "after\n" {
			t.Errorf("exec after a timeout: %q", out)
		}
	})
	t.Run("bad_request", func(t *testing.T) {
		for _, body := range []map[string]any{{}, {"command": ""}, {"command": []string{}}, {"command": "true", "timeout_s": 0}} {
			r := d.call(t, "POST", "/v1/sessions/"+id+"/exec", body)
			if r.status != 400 || r.apiError().Error.Type != "invalid_request" {
				t.Errorf("exec %v: want 400 invalid_request, got %s", body, r)
			}
		}
	})
}

func testExecStream(t *testing.T, d *deployment) {
	s := d.newSession(t, nil)
	t.Run("10MB", func(t *testing.T) {
		ctx := bg(t, 90*time.Second)
		const want = 10_000_000
		var n, bad, errBytes int
		lines := 0
		final, err := d.streamExec(ctx, s.ID, map[string]any{"command": "head -c 10000000 /dev/zero | tr '\\0' a"}, func() { n, bad, errBytes, lines = 0, 0, 0, 0 }, func(stream string, b []byte) {
			lines++
			if stream != "stdout" {
				errBytes += len(b)
				return
			}
			n += len(b)
			bad += len(b) - bytes.Count(b, []byte{'a'})
		})
		if err != nil {
			t.Fatalf("after %d stdout bytes in %d lines: %v", n, lines, err)
		}
		if n != want || bad != 0 || errBytes != 0 {
			t.Errorf("10 MB of 'a' streamed: got %d stdout bytes (%d not 'a'), %d stderr bytes, in %d lines; want exactly %d", n, bad, errBytes, lines, want)
		}
		if *final.ExitCode != 0 {
			t.Errorf("final line: exit_code %d, want 0", *final.ExitCode)
		}
		if lines < 2 {
			t.Errorf("10 MB came in %d line(s); a stream should deliver it in chunks", lines)
		}
	})
	t.Run("interleaved_and_exit_code", func(t *testing.T) {
		var out, errb bytes.Buffer
		final, err := d.streamExec(bg(t, 30*time.Second), s.ID, map[string]any{"command": "echo one; echo two >&2; sleep 0.2; echo three; exit 5"}, func() { out.Reset(); errb.Reset() }, func(stream string, b []byte) {
			if stream == "stdout" {
				out.Write(b)
			} else {
				errb.Write(b)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if out.String() != "one\nthree\n" || errb.String() != "two\n" || *final.ExitCode != 5 {
			t.Errorf("want stdout %q, stderr %q, exit 5; got %q, %q, exit %d", "one\nthree\n", "two\n", out.String(), errb.String(), *final.ExitCode)
		}
	})
	// Output that is not UTF-8 must arrive byte for byte (e.g. as "encoding":"base64" lines),
	// not with U+FFFD substituted.
	t.Run("binary_stdout", func(t *testing.T) {
		var out bytes.Buffer
		_, err := d.streamExec(bg(t, 30*time.Second), s.ID, map[string]any{"command": `printf '\377\376\000\001ok'`}, out.Reset, func(stream string, b []byte) {
			if stream == "stdout" {
				out.Write(b)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := []byte{0xff, 0xfe, 0x00, 0x01, 'o', 'k'}; !bytes.Equal(out.Bytes(), want) {
			t.Errorf("streamed stdout of printf '\\377\\376\\000\\001ok': got bytes % x, want % x (binary output must not be altered; send such chunks with \"encoding\":\"base64\")", out.Bytes(), want)
		}
	})
}

// wsURL turns the deployment's base URL into a ws:// one.
func (d *deployment) wsURL(path string) string {
	u := d.url + path
	if rest, ok := strings.CutPrefix(u, "https://"); ok {
		return "wss://" + rest
	}
	return "ws://" + strings.TrimPrefix(u, "http://")
}

// pty is a terminal connection whose output is collected in the background.
type pty struct {
	c    *websocket.Conn
	mu   sync.Mutex
	out  bytes.Buffer
	err  error
	done chan struct{}
}

func (d *deployment) openPTY(t testing.TB, ctx context.Context, id string, cols, rows int) *pty {
	t.Helper()
	c, resp, err := websocket.Dial(ctx, d.wsURL(fmt.Sprintf("/v1/sessions/%s/pty?cols=%d&rows=%d", id, cols, rows)),
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + d.apiKey}}})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("PTY WebSocket: %v (HTTP %d)", err, status)
	}
	c.SetReadLimit(4 << 20)
	p := &pty{c: c, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			_, b, err := c.Read(ctx)
			p.mu.Lock()
			if err != nil {
				p.err = err
				p.mu.Unlock()
				return
			}
			p.out.Write(b)
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *pty) send(t testing.TB, ctx context.Context, s string) {
	t.Helper()
	if err := p.c.Write(ctx, websocket.MessageBinary, []byte(s)); err != nil {
		t.Fatalf("PTY write %q: %v", s, err)
	}
}

// waitFor waits until the output after offset from contains want; it returns the offset after it.
func (p *pty) waitFor(t testing.TB, from int, want string, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		out, err := p.out.String(), p.err
		p.mu.Unlock()
		if from <= len(out) {
			if i := strings.Index(out[from:], want); i >= 0 {
				return from + i + len(want)
			}
		}
		if err != nil {
			t.Fatalf("PTY closed (%v) before %q; output so far: %q", err, want, out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("PTY: no %q within %s; output so far: %q", want, timeout, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testPTY(t *testing.T, d *deployment) {
	s := d.newSession(t, nil)
	ctx := bg(t, 3*time.Minute)
	p := d.openPTY(t, ctx, s.ID, 80, 24)
	defer p.c.CloseNow()
	p.send(t, ctx, "echo $((6*7))\r")
	off := p.waitFor(t, 0, "42\r\n", 60*time.Second)

	p.send(t, ctx, "stty size\r")
	off = p.waitFor(t, off, "24 80", 60*time.Second)

	rz, _ := json.Marshal(map[string]any{"type": "resize", "cols": 100, "rows": 40})
	if err := p.c.Write(ctx, websocket.MessageText, rz); err != nil {
		t.Fatalf("PTY resize frame: %v", err)
	}
	p.send(t, ctx, "stty size\r")
	p.waitFor(t, off, "40 100", 60*time.Second)

	// Every frame is activity; the session must still be running afterwards.
	if got := d.getSession(t, s.ID); got.State != "running" {
		t.Errorf("after a PTY conversation the session is %s", got.State)
	}
	_ = p.c.Close(websocket.StatusNormalClosure, "")
}

func testIsolation(t *testing.T, d *deployment) {
	a := d.newSession(t, nil)
	t.Run("processes", func(t *testing.T) {
		out := d.sh(t, a.ID, "ps")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines)-1 > 10 {
			t.Errorf("ps in the guest lists %d processes, want only the guest's own handful:\n%s", len(lines)-1, out)
		}
		self := filepath.Base(os.Args[0])
		for _, host := range []string{self, "wb serve", "runsc-sandbox", "runsc-gofer", "containerd", "dockerd", "sshd"} {
			if strings.Contains(out, host) {
				t.Errorf("the guest sees host process %q:\n%s", host, out)
			}
		}
		n := strings.TrimSpace(d.sh(t, a.ID, "ls /proc | grep -c '^[0-9]' || true"))
		if c, _ := strconv.Atoi(n); c > 10 {
			t.Errorf("the guest's /proc holds %s pids, want a handful", n)
		}
	})
	t.Run("template_read_only", func(t *testing.T) {
		for _, p := range []string{"/bin/x", "/usr/x", "/etc/x"} {
			res := d.exec(t, a.ID, map[string]any{"command": "touch " + p})
			if res.ExitCode == 0 {
				t.Errorf("touch %s succeeded: the template must be read-only", p)
			}
		}
		res := d.exec(t, a.ID, map[string]any{"command": "touch /workspace/w && echo ok > /workspace/w && cat /workspace/w"})
		if res.ExitCode != 0 || res.Stdout != "ok\n" {
			t.Errorf("/workspace must be writable: %+v", res)
		}
	})
	t.Run("no_host_loopback", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var accepted atomic.Int32
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		res := d.exec(t, a.ID, map[string]any{"command": fmt.Sprintf("echo probe | nc -w 2 127.0.0.1 %d; echo rc=$?", port), "timeout_s": 10})
		time.Sleep(300 * time.Millisecond) // the point: room for a connection the exec made to be counted
		if n := accepted.Load(); n != 0 {
			t.Errorf("the guest reached a TCP server on the host's 127.0.0.1:%d (%d connection(s) accepted); output %q %q", port, n, res.Stdout, res.Stderr)
		}
		if u, err := url.Parse(d.url); err == nil && isLoopback(d.url) {
			// Nor the control plane on the host's loopback.
			res := d.exec(t, a.ID, map[string]any{"command": fmt.Sprintf(`printf 'GET /healthz HTTP/1.0\r\n\r\n' | nc -w 2 127.0.0.1 %s`, u.Port()), "timeout_s": 10})
			if strings.Contains(res.Stdout, "HTTP/1.") {
				t.Errorf("the guest reached the gateway on the host's 127.0.0.1:%s: %q", u.Port(), res.Stdout)
			}
		}
	})
	t.Run("cross_session_files", func(t *testing.T) {
		b := d.newSession(t, nil)
		d.sh(t, a.ID, "echo s3cret-"+a.ID+" > /workspace/secret")
		if got := d.sh(t, a.ID, "cat /workspace/secret"); !strings.Contains(got, "s3cret") {
			t.Fatalf("A cannot read its own file: %q", got)
		}
		res := d.exec(t, b.ID, map[string]any{"command": "cat /workspace/secret; grep -rs s3cret /workspace /tmp /root"})
		if strings.Contains(res.Stdout, "s3cret") {
			t.Errorf("session B read A's /workspace/secret: %q", res.Stdout)
		}
		r := d.call(t, "GET", "/v1/sessions/"+b.ID+"/files?path=/workspace/secret", nil)
		if r.status != 404 {
			t.Errorf("GET B's /workspace/secret: want 404, got %s", r)
		}
	})
}

// startCounter starts a background loop writing an increasing number to /workspace/c every 0.1 s.
func startCounter(t testing.TB, d *deployment, id string, atLeast int) {
	t.Helper()
	d.sh(t, id, `(i=0; while :; do i=$((i+1)); echo $i > /workspace/c; sleep 0.1; done) >/dev/null 2>&1 &`)
	deadline := time.Now().Add(60 * time.Second)
	for readCounter(t, d, id) < atLeast {
		if time.Now().After(deadline) {
			t.Fatalf("the counter did not reach %d within 60 s", atLeast)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readCounter(t testing.TB, d *deployment, id string) int {
	t.Helper()
	var res execResult
	for range 20 {
		res = d.exec(t, id, map[string]any{"command": "cat /workspace/c 2>/dev/null || echo 0"})
		if n, err := strconv.Atoi(strings.TrimSpace(res.Stdout)); err == nil {
			return n
		}
		// The loop's `echo $i > /workspace/c` truncates first: the file can be empty for a moment.
		time.Sleep(15 * time.Millisecond)
	}
	t.Fatalf("counter file: %q %q", res.Stdout, res.Stderr)
	return 0
}

func testPauseResume(t *testing.T, d *deployment) {
	s := d.newSession(t, nil)
	startCounter(t, d, s.ID, 3)
	// The counter may advance while it runs: from the read of before until the pause takes
	// hold, and from the resume until the read of after. Those spells are timed from outside
	// (each includes its requests' time), so a slow machine widens the allowance instead of
	// failing the test.
	readStart := time.Now()
	before := readCounter(t, d, s.ID)
	r := d.call(t, "POST", "/v1/sessions/"+s.ID+":pause", nil)
	running := time.Since(readStart)
	expect(t, r, 200, "POST :pause")
	var ps sessionObj
	r.decode(t, &ps)
	if ps.State != "paused" {
		t.Errorf(":pause answered a session in %q, want paused", ps.State)
	}
	r = d.call(t, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"command": "echo hi"})
	if e := r.apiError(); r.status != 409 || e.Error.Type != "invalid_state" || !strings.Contains(e.Error.Message, "paused") {
		t.Errorf("exec in a paused session: want 409 invalid_state naming the state paused, got %s", r)
	}
	r = d.call(t, "POST", "/v1/sessions/"+s.ID+":pause", nil)
	if r.status != 409 {
		t.Errorf("pausing a paused session: want 409, got %s", r)
	}
	const pause = 3 * time.Second // the point: 30 ticks if it were not paused
	time.Sleep(pause)
	resumeStart := time.Now()
	r = d.call(t, "POST", "/v1/sessions/"+s.ID+":resume", nil)
	expect(t, r, 200, "POST :resume")
	r.decode(t, &ps)
	if ps.State != "running" {
		t.Errorf(":resume answered a session in %q, want running", ps.State)
	}
	after := readCounter(t, d, s.ID)
	running += time.Since(resumeStart)
	allowed := int(running/(100*time.Millisecond)) + 3 // at most one tick per 0.1 s, and rounding
	switch {
	case after < before:
		t.Errorf("after resume the counter is %d, below %d before the pause: the guest restarted", after, before)
	case allowed >= int(pause/(100*time.Millisecond)):
		t.Logf("the requests around the pause took %s: too slow to tell a pause from a run (counter %d → %d)", running, before, after)
	case after-before > allowed:
		t.Errorf("the counter went %d → %d across a %s pause (at most %d outside it): it kept running while paused", before, after, pause, allowed)
	}
	waitCounterAbove(t, d, s.ID, after, "after resume the background process does not continue")
}

// waitCounterAbove waits until the counter of startCounter passes n.
func waitCounterAbove(t testing.TB, d *deployment, id string, n int, failure string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := readCounter(t, d, id)
		if v > n {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: the counter stays at %d (was %d) for 30 s", failure, v, n)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func testSnapshot(t *testing.T, d *deployment) {
	t.Run("delete", func(t *testing.T) {
		t.Parallel()
		if d.tmp == "" {
			t.Skip("needs the deployment's data dir")
		}
		s := d.newSession(t, nil)
		snap := d.snapshot(t, s.ID, false)
		dir := filepath.Join(d.tmp, "data", "node", "snapshots", snap.ID)
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("the snapshot's files are not on the node: %v", err)
		}
		expect(t, d.call(t, "DELETE", "/v1/snapshots/"+snap.ID, nil), 200, "DELETE snapshot")
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("DELETE left the snapshot's files on the node: %v", err)
		}
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		s := d.newSession(t, nil)
		startCounter(t, d, s.ID, 20)
		before := readCounter(t, d, s.ID) // the snapshot holds at least this
		r := d.call(t, "POST", "/v1/sessions/"+s.ID+":snapshot", map[string]any{"include_memory": true})
		if r.status == 502 && strings.Contains(string(r.body), "checkpoint failed") {
			// Was a platform bug on loaded hosts (runsc checkpoint racing the agent's return;
			// the agent now waits for the node's word, node/ops.go): kept as a retry with a log
			// line, so that a regression shows in the log without hiding the rest.
			t.Logf("memory snapshot: %s (runsc checkpoint race under load); retrying on a new session", r)
			s = d.newSession(t, nil)
			startCounter(t, d, s.ID, 20)
			before = readCounter(t, d, s.ID)
			r = d.call(t, "POST", "/v1/sessions/"+s.ID+":snapshot", map[string]any{"include_memory": true})
		}
		snap := d.awaitSnapshot(t, s.ID, r)
		if got := d.getSession(t, s.ID); got.State != "running" {
			t.Errorf("after :snapshot the session is %s, want running", got.State)
		}
		switch d.runtime {
		case "runsc":
			if !snap.IncludeMemory {
				t.Fatalf("runsc can checkpoint memory, yet the snapshot says include_memory false: %+v", snap)
			}
		case "runc":
			if snap.IncludeMemory {
				t.Errorf("runc cannot checkpoint memory here, yet the snapshot says include_memory true: %+v", snap)
			}
		}
		if !snap.IncludeMemory {
			t.Logf("%s: include_memory false; only the disk is restored", d.name)
			return
		}
		// Stop the source so that only the restored guest can advance a counter.
		d.deleteSession(s.ID)
		r = d.call(t, "POST", "/v1/sessions", map[string]any{"tier": 2, "restore_from": snap.ID})
		expect(t, r, 201, "POST /v1/sessions restore_from "+snap.ID)
		var ns sessionObj
		r.decode(t, &ns)
		d.track(ns.ID)
		t.Cleanup(func() { d.deleteSession(ns.ID) })
		if ns.ID == s.ID {
			t.Fatalf("restore_from reused the source's id %s", s.ID)
		}
		d.waitState(t, ns.ID, "running", 60*time.Second)
		v1 := readCounter(t, d, ns.ID)
		if v1 < before {
			t.Errorf("restored counter reads %d, below the %d it had reached before the snapshot: it restarted instead of continuing", v1, before)
		}
		waitCounterAbove(t, d, ns.ID, v1, "the snapshot's processes were not restored")
	})
	t.Run("disk", func(t *testing.T) {
		t.Parallel()
		s := d.newSession(t, nil)
		content := []byte("kept across a disk snapshot " + s.ID + "\n")
		expect(t, d.call(t, "PUT", "/v1/sessions/"+s.ID+"/files?path=/workspace/keep/me.txt", content), 204, "PUT file")
		snap := d.snapshot(t, s.ID, false)
		if snap.IncludeMemory {
			t.Errorf("a snapshot asked with include_memory false says include_memory true")
		}
		// Changes after the snapshot must not leak into it.
		expect(t, d.call(t, "PUT", "/v1/sessions/"+s.ID+"/files?path=/workspace/keep/me.txt", []byte("changed")), 204, "PUT file")
		ns := d.newSession(t, map[string]any{"restore_from": snap.ID})
		r := d.call(t, "GET", "/v1/sessions/"+ns.ID+"/files?path=/workspace/keep/me.txt", nil)
		expect(t, r, 200, "GET the file in the restored session")
		if !bytes.Equal(r.body, content) {
			t.Errorf("restored file: %q, want %q", r.body, content)
		}
	})
}

func testFiles(t *testing.T, d *deployment) {
	s := d.newSession(t, nil)
	base := "/v1/sessions/" + s.ID + "/files?path="
	content := make([]byte, 0, 256*40)
	for i := range 256 * 40 {
		content = append(content, byte(i))
	}
	expect(t, d.call(t, "PUT", base+"/workspace/dir/f.bin", content), 204, "PUT /workspace/dir/f.bin")
	r := d.call(t, "GET", base+"/workspace/dir/f.bin", nil)
	expect(t, r, 200, "GET /workspace/dir/f.bin")
	if !bytes.Equal(r.body, content) {
		t.Errorf("GET returned %d bytes that differ from the %d put", len(r.body), len(content))
	}
	if got := d.sh(t, s.ID, "wc -c < /workspace/dir/f.bin"); strings.TrimSpace(got) != strconv.Itoa(len(content)) {
		t.Errorf("the guest sees %s bytes in the uploaded file, want %d", strings.TrimSpace(got), len(content))
	}
	d.sh(t, s.ID, "echo from-guest > /workspace/dir/g.txt")

	type entry struct {
		Name  string `json:"name"`
		Size  int64  `json:"size"`
		IsDir bool   `json:"is_dir"`
	}
	list := func() map[string]entry {
		r := d.call(t, "GET", base+"/workspace/dir/&list=1", nil)
		expect(t, r, 200, "list /workspace/dir/")
		var l struct {
			Object string  `json:"object"`
			Data   []entry `json:"data"`
		}
		r.decode(t, &l)
		if l.Object != "list" {
			t.Errorf("listing: object %q, want list", l.Object)
		}
		m := map[string]entry{}
		for _, e := range l.Data {
			m[e.Name] = e
		}
		return m
	}
	m := list()
	if e, ok := m["f.bin"]; !ok || e.Size != int64(len(content)) || e.IsDir {
		t.Errorf("listing lacks f.bin of %d bytes: %+v", len(content), m)
	}
	if _, ok := m["g.txt"]; !ok {
		t.Errorf("listing lacks g.txt written by the guest: %+v", m)
	}
	r = d.call(t, "GET", base+"/workspace/dir/g.txt", nil)
	if r.status != 200 || string(r.body) != "from-guest\n" {
		t.Errorf("GET a file the guest wrote: %s", r)
	}
	expect(t, d.call(t, "DELETE", base+"/workspace/dir/f.bin", nil), 204, "DELETE /workspace/dir/f.bin")
	r = d.call(t, "GET", base+"/workspace/dir/f.bin", nil)
	if r.status != 404 || r.apiError().Error.Type != "not_found" {
		t.Errorf("GET a deleted file: want 404 not_found, got %s", r)
	}
	if _, ok := list()["f.bin"]; ok {
		t.Errorf("f.bin is still listed after DELETE")
	}
	r = d.call(t, "GET", base+"/workspace/no/such/file", nil)
	if r.status != 404 || r.apiError().Error.Type != "not_found" {
		t.Errorf("GET a missing file: want 404 not_found, got %s", r)
	}
	r = d.call(t, "GET", "/v1/sessions/"+s.ID+"/files", nil)
	if r.status != 400 {
		t.Errorf("GET files without path: want 400, got %s", r)
	}
}

type templateObj struct {
	Name     string   `json:"name"`
	Digest   string   `json:"digest"`
	Runtimes []string `json:"runtimes"`
}

func (d *deployment) templates(t testing.TB) []templateObj {
	t.Helper()
	r := d.call(t, "GET", "/v1/templates", nil)
	expect(t, r, 200, "GET /v1/templates")
	var l struct {
		Object string        `json:"object"`
		Data   []templateObj `json:"data"`
	}
	r.decode(t, &l)
	return l.Data
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func testTemplates(t *testing.T, d *deployment) {
	got := map[string]templateObj{}
	for _, tp := range d.templates(t) {
		got[tp.Name] = tp
	}
	for _, name := range []string{"tpl_base", "tpl_dev_polyglot"} {
		tp, ok := got[name]
		if !ok {
			t.Errorf("GET /v1/templates lacks %s (has %v)", name, got)
			continue
		}
		if !digestRE.MatchString(tp.Digest) {
			t.Errorf("%s digest %q, want sha256: and 64 hex digits", name, tp.Digest)
		}
		if len(tp.Runtimes) == 0 {
			t.Errorf("%s lists no runtimes", name)
		}
	}
	if !slices.Contains(got["tpl_dev_polyglot"].Runtimes, "python3") {
		t.Errorf("tpl_dev_polyglot runtimes %v lack python3", got["tpl_dev_polyglot"].Runtimes)
	}
}

type runObj struct {
	ID        string          `json:"id"`
	Object    string          `json:"object"`
	SessionID string          `json:"session_id"`
	State     string          `json:"state"`
	ExitCode  *int            `json:"exit_code"`
	Stdout    string          `json:"stdout"`
	Stderr    string          `json:"stderr"`
	Error     json.RawMessage `json:"error"`
}

// run posts an ephemeral run and expects 200 or 201. A run that failed with the platform's
// exec flake (see Exec/reliability) is retried.
func (d *deployment) run(t testing.TB, body map[string]any) (runObj, *response) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		r := d.call(t, "POST", "/v1/runs", body)
		if r.status != 200 && r.status != 201 {
			t.Fatalf("POST /v1/runs %v: %s", body, r)
		}
		var run runObj
		r.decode(t, &run)
		if run.State == "failed" && strings.Contains(string(run.Error), "the answer ended without a result") && attempt < 4 {
			t.Logf("run failed with the exec flake (platform bug, see Exec/reliability); retrying: %s", r)
			continue
		}
		return run, r
	}
}

func testRuns(t *testing.T, d *deployment) {
	t.Run("python3", func(t *testing.T) {
		run, r := d.run(t, map[string]any{"tier": 1, "runtime": "python3", "code": "print(6*7)"})
		if run.State != "succeeded" || run.ExitCode == nil || *run.ExitCode != 0 || run.Stdout != "42\n" {
			t.Errorf("python3 print(6*7): want succeeded, exit 0, stdout \"42\\n\"; got %s", r)
		}
		if !strings.HasPrefix(run.ID, "run_") {
			t.Errorf("run id %q lacks run_", run.ID)
		}
		r = d.call(t, "GET", "/v1/runs/"+run.ID, nil)
		expect(t, r, 200, "GET /v1/runs/"+run.ID)
		// Ephemeral: its session is gone (or going) once the run ended.
		if run.SessionID != "" {
			deadline := time.Now().Add(60 * time.Second)
			for {
				s := d.getSession(t, run.SessionID)
				if terminal[s.State] {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("the ephemeral run's session %s is still %s 60 s after the run", s.ID, s.State)
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	})
	// Every runtime offered runs a program in its language: one listed that cannot (as go
	// and gcc could not, given code) is a runtime in name only.
	t.Run("every_runtime", func(t *testing.T) {
		programs := map[string]string{
			"sh":      "echo $((6*7))",
			"python3": "print(6*7)",
			"node":    "console.log(6*7)",
			"gcc":     "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 6*7); return 0; }\n",
		}
		seen := map[string]bool{}
		for _, tp := range d.templates(t) {
			for _, rt := range tp.Runtimes {
				if seen[rt] {
					continue
				}
				seen[rt] = true
				code, ok := programs[rt]
				if !ok {
					t.Errorf("runtime %s (template %s): no program of its language here; add one", rt, tp.Name)
					continue
				}
				if run, r := d.run(t, map[string]any{"tier": 1, "runtime": rt, "code": code}); run.State != "succeeded" || run.Stdout != "42\n" {
					t.Errorf("runtime %s: want succeeded with stdout \"42\\n\"; got %s", rt, r)
				}
			}
		}
	})
	t.Run("nothing_shared", func(t *testing.T) {
		code := "import os\np='/workspace/run-mark'\nprint(os.path.exists(p))\nopen(p,'w').write('x')"
		for i := range 2 {
			run, r := d.run(t, map[string]any{"tier": 1, "runtime": "python3", "code": code})
			if run.Stdout != "False\n" {
				t.Errorf("ephemeral run %d saw a file left by an earlier run (or failed): %s", i, r)
			}
		}
	})
	t.Run("unknown_runtime", func(t *testing.T) {
		r := d.call(t, "POST", "/v1/runs", map[string]any{"tier": 1, "runtime": "cobol", "code": "DISPLAY 42"})
		e := r.apiError()
		if r.status != 400 || e.Error.Type != "invalid_request" {
			t.Fatalf("unknown runtime: want 400 invalid_request, got %s", r)
		}
		if e.Error.Param != "runtime" {
			t.Errorf("unknown runtime: param %q, want runtime", e.Error.Param)
		}
		var all []string
		for _, tp := range d.templates(t) {
			all = append(all, tp.Runtimes...)
		}
		seen := map[string]bool{}
		for _, rt := range all {
			if seen[rt] {
				continue
			}
			seen[rt] = true
			if !regexp.MustCompile(`\b` + regexp.QuoteMeta(rt) + `\b`).MatchString(e.Error.Message) {
				t.Errorf("unknown runtime: message %q does not list available runtime %q", e.Error.Message, rt)
			}
		}
		// Each runtime once.
		if _, list, ok := strings.Cut(e.Error.Message, "available: "); ok {
			names := map[string]int{}
			for _, n := range strings.Split(list, ",") {
				names[strings.TrimSpace(n)]++
			}
			for n, c := range names {
				if c > 1 {
					t.Errorf("unknown runtime: message lists %q %d times: %q", n, c, e.Error.Message)
				}
			}
		}
	})
}

func testClientDisconnect(t *testing.T, d *deployment) {
	s := d.newSession(t, nil)
	// A PTY with a command running, dropped without a close frame.
	ctx := bg(t, 3*time.Minute)
	p := d.openPTY(t, ctx, s.ID, 80, 24)
	p.send(t, ctx, "echo pty-up\r")
	off := p.waitFor(t, 0, "pty-up\r\n", 60*time.Second)
	p.send(t, ctx, "echo sleeping; sleep 300\r")
	p.waitFor(t, off, "sleeping\r\n", 60*time.Second) // the shell runs the line: sleep is next
	p.c.CloseNow()

	// A streamed exec, dropped after its first line.
	sctx, cancel := context.WithCancel(ctx)
	first := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		_, err := d.streamExec(sctx, s.ID, map[string]any{"command": "while :; do echo tick; sleep 0.05; done", "timeout_s": 60}, nil,
			func(string, []byte) { once.Do(func() { close(first) }) })
		errc <- err
	}()
	select {
	case <-first:
	case err := <-errc:
		t.Fatalf("streamed exec ended before its first line: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("no first line from the streamed exec within 15 s")
	}
	cancel() // closes the connection mid-stream
	<-errc

	time.Sleep(500 * time.Millisecond) // the point: room for the drops to do harm, if they would
	if got := d.getSession(t, s.ID); got.State != "running" {
		t.Fatalf("after dropped PTY and stream connections the session is %s (%s), want running", got.State, got.reason())
	}
	if out := d.sh(t, s.ID, "echo still-here"); out != "still-here\n" {
		t.Errorf("exec after dropped connections: %q", out)
	}
	// A new PTY works too.
	p2 := d.openPTY(t, ctx, s.ID, 80, 24)
	defer p2.c.CloseNow()
	p2.send(t, ctx, "echo again\r")
	p2.waitFor(t, 0, "again\r\n", 60*time.Second)
	// The dropped stream's command should not run on unattended (informational).
	time.Sleep(2 * time.Second)
	if out := d.exec(t, s.ID, map[string]any{"command": "ps"}).Stdout; strings.Contains(out, "echo tick") {
		t.Logf("note: the dropped streamed exec's command still runs 2 s later:\n%s", out)
	}
}

// testNoSlotLeak deletes every session the tests made and expects that none of the project's
// sessions (only ours for an external deployment) is left in a state that holds a slot.
func testNoSlotLeak(t *testing.T, d *deployment) {
	for _, id := range d.tracked() {
		d.deleteSession(id)
	}
	ours := map[string]bool{}
	for _, id := range d.tracked() {
		ours[id] = true
	}
	var left []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		left = left[:0]
		for _, st := range nonTerminal {
			for _, s := range d.listSessions(t, st) {
				if s.State != st {
					t.Errorf("GET /v1/sessions?state=%s returned %s in %s", st, s.ID, s.State)
				}
				if d.cmd != nil || ours[s.ID] {
					left = append(left, s.ID+" "+s.State)
				}
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after deleting all %d sessions the tests made, %d still hold a slot: %v", len(ours), len(left), left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testSecondServer starts a second `wb serve` with the same runtime but its own --data-dir on
// this host and checks that the deployment's guests survive it: two servers with separate data
// dirs must not share or reap each other's guests. The deployment is restarted afterwards, so
// that later tests and benchmarks get a clean one.
func testSecondServer(t *testing.T, d *deployment) {
	if d.cmd == nil || binPath == "" {
		t.Skip("needs a deployment this test process started")
	}
	s := d.newSession(t, nil)
	d.sh(t, s.ID, "echo alive")
	other, err := startServer(binPath, d.runtime, "--pool", "0")
	if err != nil {
		t.Fatalf("second server: %v", err)
	}
	defer func() {
		other.stop()
		if err := d.restart(); err != nil {
			t.Fatalf("restart %s deployment: %v", d.name, err)
		}
	}()
	// The second node reaps "orphans" while it starts; give it 8 s.
	var r *response
	for end := time.Now().Add(8 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		r = d.call(t, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"command": "echo alive"})
		var res execResult
		_ = json.Unmarshal(r.body, &res)
		ok := r.status == 200 && res.Stdout == "alive\n"
		if !ok && !strings.Contains(string(r.body), "the answer ended without a result") { // not the exec flake
			break
		}
		if ok && time.Now().After(end) {
			return
		}
	}
	t.Errorf("starting a second `wb serve --runtime %s --data-dir <other>` on this host broke a running session of the first: exec \"echo alive\" → %s, want 200 with stdout \"alive\\n\"\nsecond server's log:\n%s",
		d.runtime, r, other.stderrTail(20))
	// The guest is gone; the session must not keep claiming to run.
	deadline := time.Now().Add(10 * time.Second)
	for {
		g := d.getSession(t, s.ID)
		if g.State != "running" {
			t.Logf("session %s became %s (%s)", s.ID, g.State, g.reason())
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("its guest destroyed, session %s still says running 10 s later (state_reason %s); a lost guest should end it (failed, host_failure)", s.ID, g.reason())
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}
