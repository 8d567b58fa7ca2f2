package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"wb/session"
)

// A buffered Exec (nil out) keeps MaxOutputBytes per stream and counts the rest.
func TestBufferedExecIsCapped(t *testing.T) {
	t.Parallel()
	c, _ := startAgent(t, false)
	c.MaxOutputBytes = 64 << 10
	res, err := c.Exec(testCtx(t, 120*time.Second), ExecRequest{
		TimeoutS: 600, Argv: []string{"sh", "-c", "yes | head -c 3000000; echo oops >&2"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Truncated || len(res.Stdout) != 64<<10 || res.StdoutBytes != 3000000 || res.Stderr != "oops\n" || res.StderrBytes != 5 {
		t.Fatalf("truncated %v, stdout %d of %d bytes, stderr %q (%d)", res.Truncated, len(res.Stdout), res.StdoutBytes, res.Stderr, res.StderrBytes)
	}
}

// A stream is back-pressured: while its reader stalls, the command blocks on its pipe instead
// of its output piling up in the agent.
func TestStreamIsBackPressured(t *testing.T) {
	t.Parallel()
	c, _ := startAgent(t, false)
	marker := filepath.Join(t.TempDir(), "wrote-all")
	const n = 16 << 20
	stalled := false
	res, err := c.Exec(testCtx(t, 300*time.Second), ExecRequest{
		TimeoutS: 600, Argv: []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a; touch %s", n, marker)},
	}, func(ch session.ExecChunk) error {
		if !stalled {
			stalled = true
			// The point: a stalled reader. 2 s is ample for 16 MiB to pass if nothing held it back.
			time.Sleep(2 * time.Second)
			if _, err := os.Stat(marker); err == nil {
				return fmt.Errorf("the command wrote all %d bytes while nobody read: output is buffered without bound", n)
			}
		}
		if strings.Trim(ch.Data, "a") != "" {
			return fmt.Errorf("foreign bytes")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exit %d", res.ExitCode)
	}
}

// Output already in the pipe is read even when the drain deadline passed before the reader
// got to it: on a loaded host an exec of "echo N" once answered exit 0 and no stdout, its
// reader having been woken by the deadline, not by the data.
func TestOutputInThePipeOutlivesThePassedDeadline(t *testing.T) {
	t.Parallel()
	for _, writerOpen := range []bool{false, true} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteString("81\n"); err != nil {
			t.Fatal(err)
		}
		if !writerOpen {
			_ = w.Close() // the command exited
		}
		_ = r.SetReadDeadline(time.Now().Add(-time.Second))
		out := make(chan outChunk, 4)
		pump(t.Context(), "stdout", r, out, &drainState{})
		close(out)
		var got strings.Builder
		for c := range out {
			got.Write(c.data)
		}
		if got.String() != "81\n" {
			t.Errorf("writer open %v: read %q, want the pipe's %q", writerOpen, got.String(), "81\n")
		}
		_, _ = r.Close(), w.Close()
	}
}

// An exec's status goes out with its first output or its result, not before the command
// runs: under gVisor each write to the agent's socket costs its caller a third of a
// millisecond, and a command without output is answered in one write, status and result
// together.
func TestSilentExecAnswersInOneWrite(t *testing.T) {
	t.Parallel()
	_, cfg := startAgent(t, false)
	conn, err := net.Dial("unix", cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"argv":["sleep","0.3"]}`
	if _, err := fmt.Fprintf(conn, "POST /v1/exec HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 64<<10)
	n, err := conn.Read(buf) // the first bytes to arrive
	if err != nil {
		t.Fatal(err)
	}
	first := string(buf[:n])
	if !strings.HasPrefix(first, "HTTP/1.1 200") || !strings.Contains(first, `"exit_code":0`) || !strings.HasSuffix(first, "}\n") {
		t.Errorf("the first read got %q; want the status and the whole result together", first)
	}
}

// duration_ms is rounded, not truncated: callers subtract it from their round trip to see
// the platform's share, and a truncated 0.9 ms command counted 0.9 ms to the platform.
func TestDurationRoundsToTheNearestMillisecond(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {499 * time.Microsecond, 0}, {500 * time.Microsecond, 1}, {900 * time.Microsecond, 1}, {1499 * time.Microsecond, 1}, {2*time.Second + 600*time.Microsecond, 2001}} {
		if got := roundedMs(c.d); got != c.want {
			t.Errorf("roundedMs(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

// A command's standard files are what a shell would give it: stdin /dev/null, stdout and
// stderr pipes in blocking mode (a program that writes to a non-blocking one meets EAGAIN).
// The agent makes its output pipes itself, its own ends alone non-blocking.
func TestExecStdioIsPlain(t *testing.T) {
	t.Parallel()
	c, _ := startAgent(t, false)
	for range 2 { // the second exec reuses what the first left (a shared /dev/null)
		res, err := c.Exec(testCtx(t, 60*time.Second), ExecRequest{
			Argv: []string{"sh", "-c", "readlink /proc/self/fd/0; grep ^flags /proc/self/fdinfo/1; grep ^flags /proc/self/fdinfo/2 >&2"},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if res.ExitCode != 0 || len(lines) != 2 || lines[0] != "/dev/null" {
			t.Fatalf("exit %d, stdout %q, stderr %q: want /dev/null as stdin", res.ExitCode, res.Stdout, res.Stderr)
		}
		for stream, line := range map[string]string{"stdout": lines[1], "stderr": strings.TrimSpace(res.Stderr)} {
			var flags int
			if _, err := fmt.Sscanf(line, "flags:\t%o", &flags); err != nil {
				t.Fatalf("%s: fdinfo %q: %v", stream, line, err)
			}
			if flags&syscall.O_NONBLOCK != 0 {
				t.Fatalf("%s is non-blocking (flags %o)", stream, flags)
			}
		}
	}
}

// A command path that names a FIFO (or a directory) is refused before the start, with 126 as a
// shell answers: gVisor's execve opened a FIFO and waited there for a writer, which held every
// later start of the guest (and, with its one P, the whole agent) past the exec's timeout.
func TestExecOfNonRegularFileRefused(t *testing.T) {
	t.Parallel()
	c, cfg := startAgent(t, false)
	fifo := filepath.Join(cfg.Root, "fifo")
	if err := syscall.Mkfifo(fifo, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, argv0 := range []string{fifo, "./fifo", cfg.Root} {
		if _, err := lookPath(argv0, defaultPath, cfg.Root); !errors.Is(err, errNotRegular) {
			t.Fatalf("lookPath(%q) = %v, want it refused as not a regular file", argv0, err)
		}
		res, err := c.Exec(testCtx(t, 60*time.Second), ExecRequest{Argv: []string{argv0}, TimeoutS: 5}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != ExitCannotRun || !strings.Contains(res.Stderr, "not a regular file") {
			t.Fatalf("exec %q: exit %d, stderr %q; want %d, not a regular file", argv0, res.ExitCode, res.Stderr, ExitCannotRun)
		}
	}
}
