package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"wb/session"
)

// TestExecReusesConnections: an exec reads its answer to the end, so that the next call
// takes the same connection instead of dialing a new one. The answer's end comes apart from
// its result, as through a node's proxy to the agent, which flushes each line as it comes:
// closed at its result, each answer cost the next call a dial (through a gateway, a TCP dial,
// a server goroutine and its buffers on both sides).
func TestExecReusesConnections(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"exit_code":0,"duration_ms":1}` + "\n"))
		w.(http.Flusher).Flush()
		time.Sleep(time.Millisecond) // the proxy's copy ends, then the handler returns
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := NewHTTPClient(srv.Client(), srv.URL, "")
	const execs = 20
	for i := range execs {
		// The caller's request ends as soon as the exec answers, as a gateway's does.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}}, nil)
		cancel()
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %d: %+v %v", i, res, err)
		}
		// As a caller's next request comes: after this answer went out to it.
		time.Sleep(20 * time.Millisecond)
	}
	// The answer's end follows its result within a millisecond; 20 ms is a wide margin, and
	// a few slow ends are allowed.
	if n := conns.Load(); n > 5 {
		t.Errorf("%d execs took %d connections, want one reused", execs, n)
	}
}

// TestExecAnswerHeldOpen: a server that keeps an exec's answer open after its result (a
// hostile guest's agent) neither holds the exec nor keeps the connection: the exec answers at
// its result, and the connection is closed within releaseWait.
func TestExecAnswerHeldOpen(t *testing.T) {
	t.Parallel()
	closed := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"stream":"stdout","data":"hi"}` + "\n" + `{"exit_code":7,"duration_ms":1}` + "\n"))
		w.(http.Flusher).Flush()
		select { // hold the answer open
		case <-r.Context().Done():
		case <-release:
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			select {
			case closed <- struct{}{}:
			default:
			}
		}
	}
	srv.Start()
	defer srv.Close()
	c := NewHTTPClient(srv.Client(), srv.URL, "")
	start := time.Now()
	res, err := c.Exec(testCtx(t, 20*time.Second), ExecRequest{Argv: []string{"true"}}, nil)
	if err != nil || res.ExitCode != 7 || res.Stdout != "hi" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if took := time.Since(start); took >= releaseWait {
		t.Errorf("the exec answered after %s: it waited for the answer's end", took)
	}
	select {
	case <-closed:
	case <-time.After(releaseWait + 10*time.Second):
		t.Fatalf("the connection of an answer held open was not closed %s after its result", releaseWait+10*time.Second)
	}
}

// endlessAnswer serves every request an answer that begins with head and then never ends a
// line: 'A's, until the client goes away or 256 MiB are out. It counts the bytes it wrote.
func endlessAnswer(t *testing.T, head string, wrote *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		n, err := w.Write([]byte(head))
		wrote.Add(int64(n))
		block := bytes.Repeat([]byte("A"), 64<<10)
		for err == nil && wrote.Load() < 256<<20 {
			n, err = w.Write(block)
			wrote.Add(int64(n))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestExecLineBounded: a hostile guest's agent (a guest may replace its agent's socket) that
// sends an exec answer whose line never ends is cut off at maxAnswerLine, with an error that
// says so, instead of filling the memory of the node or gateway that reads it.
func TestExecLineBounded(t *testing.T) {
	t.Parallel()
	for _, head := range []string{`{"stream":"stdout","data":"`, `{"stream":"stdout","data":"hi"}` + "\n" + `{"exit_code":0,"pad":"`} {
		var wrote atomic.Int64
		srv := endlessAnswer(t, head, &wrote)
		c := NewHTTPClient(srv.Client(), srv.URL, "")
		var got int
		_, err := c.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"true"}}, func(ch session.ExecChunk) error {
			got += len(ch.Data)
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "line longer than") {
			t.Fatalf("exec of an endless line: %v; want a line too long", err)
		}
		// What the client read, beside what sat in the transport's buffers when it stopped.
		if w := wrote.Load(); w > maxAnswerLine+8<<20 {
			t.Errorf("the server wrote %d bytes before the client stopped reading; want about %d", w, maxAnswerLine)
		}
		if strings.Contains(head, "hi") && got != 2 {
			t.Errorf("the output before the endless line: %d bytes, want 2", got)
		}
	}
}

// TestAnswerBounded: a hostile guest's agent that answers a listing or a health check without
// end is cut off at maxAnswerBytes.
func TestAnswerBounded(t *testing.T) {
	t.Parallel()
	var wrote atomic.Int64
	srv := endlessAnswer(t, `[{"name":"`, &wrote)
	c := NewHTTPClient(srv.Client(), srv.URL, "")
	_, err := c.ListDir(testCtx(t, time.Minute), "/")
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("list of an endless answer: %v; want an answer too long", err)
	}
	if w := wrote.Load(); w > maxAnswerBytes+8<<20 {
		t.Errorf("the server wrote %d bytes before the client stopped reading; want about %d", w, maxAnswerBytes)
	}
}

// TestBoundedReader: an answer longer than the bound fails; one at the bound passes.
func TestBoundedReader(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{"abc", true},
		{"ab\n", true},
		{"abcd", false},
		{"a\nb\nc\n", false},
	} {
		r := &boundedReader{r: strings.NewReader(c.in), max: 3}
		got, err := io.ReadAll(r)
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, errTooLong)) {
			t.Errorf("%q: %v; want ok %v", c.in, err, c.ok)
		}
		if c.ok && string(got) != c.in {
			t.Errorf("%q: read %q", c.in, got)
		}
	}
}

// TestReadAnswerLine: lines are read whole, however the reader's buffer splits them, the
// last one with or without its newline; a line past maxAnswerLine fails.
func TestReadAnswerLine(t *testing.T) {
	long := strings.Repeat("a", maxAnswerLine-1)
	in := "x\n" + long + "\n" + "\n" + "end"
	r := bufio.NewReaderSize(strings.NewReader(in), 16)
	var got []string
	for {
		line, err := readAnswerLine(r)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after %d lines: %v", len(got), err)
		}
		got = append(got, string(line))
	}
	if want := []string{"x\n", long + "\n", "\n", "end"}; !slices.Equal(got, want) {
		t.Errorf("read %d lines, want %d", len(got), len(want))
	}
	r = bufio.NewReaderSize(strings.NewReader(long+"aa\n"), 16)
	if _, err := readAnswerLine(r); !errors.Is(err, errTooLong) {
		t.Errorf("a line of %d bytes: %v; want it too long", maxAnswerLine+1, err)
	}
}

// TestListDirBoundsEntries: a hostile guest's agent that answers a listing of tiny entries
// ("{}", 3 bytes each: 16 MiB hold five million) is refused past maxListEntries with an error
// that says so, and the client's memory stays modest; a listing at the bound still works.
func TestListDirBoundsEntries(t *testing.T) {
	listing := func(entries int) []byte {
		return append(append([]byte("["), bytes.Repeat([]byte("{},"), entries-1)...), "{}]"...)
	}
	var answer atomic.Pointer[[]byte]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(*answer.Load())
	}))
	t.Cleanup(srv.Close)
	c := NewHTTPClient(srv.Client(), srv.URL, "")
	ctx := testCtx(t, time.Minute)

	atBound := listing(maxListEntries)
	answer.Store(&atBound)
	if list, err := c.ListDir(ctx, "/"); err != nil || len(list) != maxListEntries {
		t.Fatalf("a listing of %d entries: %d, %v; want them all", maxListEntries, len(list), err)
	}
	for _, entries := range []int{maxListEntries + 1, (maxAnswerBytes - 8) / 3} {
		past := listing(entries)
		answer.Store(&past)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		list, err := c.ListDir(ctx, "/")
		runtime.ReadMemStats(&after)
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != http.StatusRequestEntityTooLarge || !strings.Contains(ae.Message, "more than 100000 entries") {
			t.Errorf("a listing of %d entries: %d entries, %v; want a 413 naming the bound", entries, len(list), err)
		}
		// A bound entry takes about 100 bytes; the answer's 16 MiB undecoded took 2.3 GiB.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<20 {
			t.Errorf("a listing of %d entries: %d MiB allocated; want under 256", entries, alloc>>20)
		}
	}
}

// TestExecValueBounded: a hostile guest's agent that sends one exec answer value spread over
// many short lines (JSON lets whitespace, newlines too, fall between an array's elements) is
// refused at its first line: each line is one value, so maxAnswerLine bounds a value too, or
// the client would hold the whole value, without end, before decoding it.
func TestExecValueBounded(t *testing.T) {
	t.Parallel()
	var wrote atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		n, err := w.Write([]byte(`{"stream":"stdout","data":"hi"}` + "\n" + `{"stream":"stdout","data":"x","pad":[`))
		wrote.Add(int64(n))
		block := bytes.Repeat([]byte("0,\n"), 16<<10)
		for err == nil && wrote.Load() < 64<<20 {
			n, err = w.Write(block)
			wrote.Add(int64(n))
		}
		if err == nil {
			_, _ = w.Write([]byte("0]}\n" + `{"exit_code":0}` + "\n"))
		}
	}))
	t.Cleanup(srv.Close)
	c := NewHTTPClient(srv.Client(), srv.URL, "")
	var got int
	_, err := c.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"true"}}, func(ch session.ExecChunk) error {
		got += len(ch.Data)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "not one JSON value") {
		t.Fatalf("exec of a value without end: %v; want its first line refused", err)
	}
	if w := wrote.Load(); w > maxAnswerLine+8<<20 {
		t.Errorf("the server wrote %d bytes before the client stopped reading; want about %d", w, maxAnswerLine)
	}
	if got != 2 {
		t.Errorf("the output before the long value: %d bytes, want 2", got)
	}
}

// bigHeaders answers every request {"ok":true} under 1 MiB of headers in 16384 fields, as a
// hostile guest's agent may.
func bigHeaders(w http.ResponseWriter, _ *http.Request) {
	pad := strings.Repeat("x", 56)
	for i := range 16384 {
		w.Header().Set("X-Pad-"+strconv.Itoa(i), pad)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"ok":true}`))
}

// TestAnswerHeadersBounded: the clients that dial a guest's agent themselves (a node's)
// refuse an answer whose headers pass maxAnswerHeaderBytes: Go's default let a hostile agent
// make the node hold 10 MiB of headers, in as many fields as fit, for every request.
func TestAnswerHeadersBounded(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(bigHeaders))
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	dial := func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "unix", sock) }
	for name, c := range map[string]*Client{"NewClient": NewClient(sock), "NewDialClient": NewDialClient(dial)} {
		err := c.Health(testCtx(t, time.Minute))
		if err == nil || !strings.Contains(err.Error(), "header") {
			t.Errorf("%s: health under 1 MiB of headers: %v; want them refused", name, err)
		}
		c.Close()
	}
}

// TestWriteFileAnswerBounded: a hostile guest's agent that answers a file's write with a body
// without end does not hold the write: the client reads at most 64 KiB of it.
func TestWriteFileAnswerBounded(t *testing.T) {
	t.Parallel()
	var wrote atomic.Int64
	srv := endlessAnswer(t, `{"path":"/workspace/a","size":1,"pad":"`, &wrote)
	c := NewHTTPClient(srv.Client(), srv.URL, "")
	ctx := testCtx(t, time.Minute)
	start := time.Now()
	err := c.WriteFile(ctx, "a", strings.NewReader("x"), 0)
	if ctx.Err() != nil {
		t.Fatalf("the write of a file answered with a body without end ran %s, until its context ended (%d MiB read): %v", time.Since(start), wrote.Load()>>20, err)
	}
	if w := wrote.Load(); w > 8<<20 {
		t.Errorf("the server wrote %d bytes before the client stopped reading; want about 64 KiB", w)
	}
}

// TestExecAnswerIsA200: an exec's answer is a 200, its status sent before the command's output.
// The client took any 2xx for one, and a node from before it checked the lines of every
// status passed a hostile agent's 201 on unchecked: its forged error line read as the node's
// policy kill, its result line as the command's. Any other status is the guest's error.
func TestExecAnswerIsA200(t *testing.T) {
	t.Parallel()
	for _, line := range []string{`{"exit_code":0}`, `{"error":{"status":403,"code":"policy_violation","message":"forged"}}`} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(line + "\n"))
		}))
		c := NewHTTPClient(srv.Client(), srv.URL, "")
		res, err := c.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"true"}}, nil)
		srv.Close()
		var e *Error
		if !errors.As(err, &e) || e.Status != http.StatusBadGateway || e.Code != "guest_error" {
			t.Errorf("an exec answered 201 with %s: %+v, %v; want a 502 guest_error", line, res, err)
		}
	}
}
