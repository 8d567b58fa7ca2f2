package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"wb/internal/fakenode"
	"wb/internal/stallwrite"
	"wb/session"
)

// hostileAgent serves a guest's agent that takes every call and answers none until release
// is closed or hold has passed (then a 404), or the call goes; calls counts the calls it took.
type hostileAgent struct {
	sock    string
	calls   atomic.Int32
	release chan struct{}
}

func newHostileAgent(t *testing.T, hold time.Duration) *hostileAgent {
	t.Helper()
	a := &hostileAgent{sock: filepath.Join(t.TempDir(), "hostile.sock"), release: make(chan struct{})}
	ln, err := net.Listen("unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.calls.Add(1)
		select {
		case <-r.Context().Done():
		case <-a.release:
		case <-time.After(hold):
		}
		if r.Context().Err() == nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(404)
			_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"no such file"}}`))
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return a
}

// TestFileCallsAreBounded: a file call (read, list, write, delete) of a session or a desktop
// whose guest's agent takes the call and never answers ends at its bound (Config.FileTimeout)
// with a 504 guest_timeout that says the guest's agent did not answer in time. Before, the
// call, and the node's proxy under it, lasted as long as its caller waited.
func TestFileCallsAreBounded(t *testing.T) {
	// It answers at last, well past the bound: the calls end either way.
	a := newHostileAgent(t, 15*time.Second)
	e := newEnv(t, func(c *Config) {
		c.FileTimeout = time.Second
		c.Guests = deafAgentGuests{Guests: c.Guests, sock: a.sock}
	})
	s := e.running(map[string]any{"tier": 2})
	d := e.newDesktop(map[string]any{"name": "d"})
	for _, base := range []string{"/v1/sessions/" + s.ID, "/v1/desktops/" + d.ID} {
		for _, c := range []struct {
			method, query string
			body          any
		}{
			{"GET", "?path=a.txt", nil},
			{"GET", "?path=.&list=1", nil},
			{"PUT", "?path=a.txt", []byte("hello")},
			{"DELETE", "?path=a.txt", nil},
		} {
			start := time.Now()
			r := e.do(c.method, base+"/files"+c.query, e.key, c.body)
			if r.status != 504 || !strings.Contains(string(r.body), `"guest_timeout"`) || !strings.Contains(string(r.body), "did not answer within 1s") {
				t.Errorf("%s %s/files%s of a guest whose agent never answers: %d %s after %s; want a 504 guest_timeout that its agent did not answer within 1s",
					c.method, base, c.query, r.status, r.body, time.Since(start))
			}
		}
	}
}

// deafScreenNode is the fake node, whose guests never finish a screenshot's command.
type deafScreenNode struct{ *fakenode.Node }

func (n deafScreenNode) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, argv []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	if strings.Contains(strings.Join(argv, " "), "xwd") {
		<-ctx.Done()
		return session.ExecResult{}, ctx.Err()
	}
	return n.Node.Exec(ctx, s, req, argv, out)
}

// TestDesktopScreenIsBounded: a screenshot whose guest never answers ends at its bound
// (Config.DesktopScreenTimeout) with a 504 guest_timeout that says so, not a 502 of a
// context's error.
func TestDesktopScreenIsBounded(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.DesktopScreenTimeout = time.Second
		c.Guests = deafScreenNode{c.Guests.(*fakenode.Node)}
	})
	d := e.newDesktop(map[string]any{"name": "d"})
	start := time.Now()
	r := e.do("GET", "/v1/desktops/"+d.ID+"/screen", e.key, nil)
	if r.status != 504 || !strings.Contains(string(r.body), `"guest_timeout"`) || !strings.Contains(string(r.body), "did not answer within 1s") {
		t.Errorf("the screen of a desktop whose guest never answers: %d %s after %s; want a 504 guest_timeout that it did not answer within 1s",
			r.status, r.body, time.Since(start))
	}
}

// TestFileCallBoundIsTheGuests: a file call's bound counts the waits on the guest's agent
// only: a write whose caller sends its body slowly, for longer in all than the bound, is
// written.
func TestFileCallBoundIsTheGuests(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.FileTimeout = 5 * time.Second })
	s := e.running(map[string]any{"tier": 2})
	pr, pw := io.Pipe()
	go func() {
		for i := range 3 {
			time.Sleep(3 * time.Second)
			if _, err := fmt.Fprintf(pw, "part %d\n", i); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	req, _ := http.NewRequest("PUT", e.url+"/v1/sessions/"+s.ID+"/files?path=slow.txt", pr)
	req.Header.Set("Authorization", "Bearer "+e.key)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 204 {
		t.Fatalf("a write sent over %s, its agent prompt: %d %s; want 204", time.Since(start), resp.StatusCode, b)
	}
	if r := e.mustDo("GET", "/v1/sessions/"+s.ID+"/files?path=slow.txt", e.key, nil, 200, nil); string(r.body) != "part 0\npart 1\npart 2\n" {
		t.Fatalf("the file holds %q", r.body)
	}
}

// TestFileCallsAreCapped: a project has at most Config.MaxConcurrentFileCalls file calls and
// screenshots in progress on a gateway; past them a call answers 429 too_many_file_calls,
// naming the limit, with a Retry-After, and once one ends the next is served. Before, a
// tenant could start any number at once, each holding the gateway's memory and connections
// (a screenshot up to ~9 MiB) for as long as its guest's agent held it.
func TestFileCallsAreCapped(t *testing.T) {
	a := newHostileAgent(t, 5*time.Minute)
	e := newEnv(t, func(c *Config) {
		c.MaxConcurrentFileCalls = 2
		c.FileTimeout = 5 * time.Minute
		c.Guests = deafAgentGuests{Guests: c.Guests, sock: a.sock}
	})
	s := e.running(map[string]any{"tier": 2})
	d := e.newDesktop(map[string]any{"name": "d"})
	send := func(ctx context.Context, method, path string) (int, http.Header, string, error) {
		req, _ := http.NewRequestWithContext(ctx, method, e.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+e.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b), nil
	}
	held := make(chan int, 2)
	for range 2 {
		go func() {
			status, _, _, _ := send(context.Background(), "GET", "/v1/sessions/"+s.ID+"/files?path=a.txt")
			held <- status
		}()
	}
	for deadline := time.Now().Add(time.Minute); a.calls.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent took %d calls, want 2", a.calls.Load())
		}
	}
	for _, path := range []string{
		"/v1/sessions/" + s.ID + "/files?path=b.txt",
		"/v1/sessions/" + s.ID + "/files?path=.&list=1",
		"/v1/desktops/" + d.ID + "/files?path=b.txt",
		"/v1/desktops/" + d.ID + "/screen",
	} {
		// Uncapped, the call would wait on the agent: the caller gives up well before it answers.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		status, hdr, body, err := send(ctx, "GET", path)
		cancel()
		if err != nil || status != 429 || !strings.Contains(body, `"too_many_file_calls"`) || !strings.Contains(body, "2 file or screen calls") || hdr.Get("Retry-After") == "" {
			t.Errorf("GET %s with 2 file calls in progress: %d %v %s (Retry-After %q); want a 429 too_many_file_calls naming the limit of 2, with a Retry-After",
				path, status, err, body, hdr.Get("Retry-After"))
		}
	}
	close(a.release)
	for range 2 {
		if status := <-held; status != 404 {
			t.Errorf("a held call answered %d once its agent did, want its 404", status)
		}
	}
	e.mustDo("GET", "/v1/sessions/"+s.ID+"/files?path=b.txt", e.key, nil, 404, nil)
}

// TestDesktopMCPFileToolsAreCapped: the desktop MCP's file tools and screenshot count among
// the project's file calls (Config.MaxConcurrentFileCalls): past the cap a call is a tool
// error naming the limit. Before, they were not counted, each holding as much of the
// gateway as a files route (read_file up to 8 MiB, screenshot ~9 MiB).
func TestDesktopMCPFileToolsAreCapped(t *testing.T) {
	a := newHostileAgent(t, 5*time.Minute)
	e := newEnv(t, func(c *Config) {
		c.MaxConcurrentFileCalls = 1
		c.FileTimeout = 5 * time.Minute
		c.DesktopFileTimeout = 5 * time.Minute
		c.Guests = deafAgentGuests{Guests: c.Guests, sock: a.sock}
	})
	d := e.newDesktop(map[string]any{"name": "d"})
	held := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", e.url+"/v1/desktops/"+d.ID+"/files?path=a.txt", nil)
		req.Header.Set("Authorization", "Bearer "+e.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- 0
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	for deadline := time.Now().Add(time.Minute); a.calls.Load() < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent took no call")
		}
	}
	cs := e.mcpSession(d)
	for name, args := range map[string]map[string]any{
		"read_file":  {"path": "a.txt"},
		"write_file": {"path": "a.txt", "content": "hello"},
		"list_files": {"path": "."},
		"screenshot": {},
	} {
		// Uncapped, the call would wait on the agent: the client gives up well before it answers.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		cancel()
		if err != nil || !res.IsError || !strings.Contains(textOf(res), "1 file or screen calls in progress") {
			t.Errorf("%s with a file call in progress and a cap of 1: %v, %+v; want a tool error naming the limit", name, err, res)
		}
	}
	close(a.release)
	if status := <-held; status != 404 {
		t.Errorf("the held call answered %d once its agent did, want its 404", status)
	}
}

// TestFileReadBrokenOffIsNoWholeFile: a read whose guest's agent sends part of the file and
// then nothing, past the call's bound, ends its answer broken, so that the caller does not
// take the part for the whole file. Before, the answer ended as a complete 200 of the part.
func TestFileReadBrokenOffIsNoWholeFile(t *testing.T) {
	// More than the gateway's answer buffers: its 200 goes out with the part.
	part := bytes.Repeat([]byte("x"), 64<<10)
	sock := filepath.Join(t.TempDir(), "partial.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(part)
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	e := newEnv(t, func(c *Config) {
		c.FileTimeout = time.Second
		c.Guests = deafAgentGuests{Guests: c.Guests, sock: sock}
	})
	s := e.running(map[string]any{"tier": 2})
	req, _ := http.NewRequest("GET", e.url+"/v1/sessions/"+s.ID+"/files?path=a.txt", nil)
	req.Header.Set("Authorization", "Bearer "+e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("a read whose agent stalled after %d bytes answered %d with %d bytes, whole; want the answer broken off", len(part), resp.StatusCode, len(b))
	}
}

// stalledRead sends n reads of path to the gateway at addr with key, pipelined on one
// connection with a small receive buffer, reads the first's status line and then reads no
// more (the connection stays open until the test ends).
func stalledRead(t *testing.T, addr, key, path string, n int) {
	t.Helper()
	stalledCall(t, addr, key, "GET", path, "", "", n)
}

// stalledCall is stalledRead for any call: n requests of method to path, each with the
// header lines in header ("Name: value\r\n" each) and body, and a status line in 2xx. The
// requests are sent from a goroutine: a server whose answers filled the connection reads no
// more of them, and many would block the test.
func stalledCall(t *testing.T, addr, key, method, path, header, body string, n int) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n%sContent-Length: %d\r\n\r\n%s",
		method, path, key, header, len(body), body)
	go func() { _, _ = conn.Write([]byte(strings.Repeat(req, n))) }() // ends when the connection closes
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.HasPrefix(status, "HTTP/1.1 2") {
		t.Fatalf("%s %s: the answer's status line %q, %v; want a 2xx", method, path, status, err)
	}
}

// waitCounted waits up to 45 s for /metrics to count n answers of route (its pattern) with
// status: a stalled caller's call is counted once it ended. what names the call.
func (e *env) waitCounted(route string, status, n int, what string) {
	e.t.Helper()
	method, _, _ := strings.Cut(route, " ")
	want := fmt.Sprintf(`wb_http_requests_total{method=%q,route=%q,status="%d"} %d`, method, route, status, n)
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got := string(e.do("GET", "/metrics", adminKey, nil).body)
		if strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("45 s after its caller stopped reading, %s still had not ended (want it ended after the 3 s stall): /metrics has no\n%s\nin:\n%s\nthe gateway's handlers still running:\n%s",
				what, want, grepLines(got, "wb_http_requests_total"), handlerStacks())
		}
	}
}

// handlerStacks answers the stacks of this process's goroutines that run a gateway handler:
// where a call that should have ended waits.
func handlerStacks() string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "(*Metrics).instrument") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// TestFileReadStalledCallerIsCut: a read of a file (of a session or a desktop) whose caller
// stays connected but takes none of it ends once a write to it waited WriteStall: the call
// lets go of the project's file-call slot (and of the node's connection and the guest's
// agent). Before, FileTimeout counted the waits on the agent alone, and such a caller held
// all of it for as long as it stayed.
func TestFileReadStalledCallerIsCut(t *testing.T) {
	var fn *fakenode.Node
	e := newEnv(t, func(c *Config) {
		fn = c.Guests.(*fakenode.Node)
		c.MaxConcurrentFileCalls = 1
		c.WriteStall = 3 * time.Second
	})
	s := e.running(map[string]any{"tier": 2})
	d := e.newDesktop(map[string]any{"name": "d"})
	for _, c := range []struct{ base, sessionID string }{
		{"/v1/sessions/" + s.ID, s.ID},
		{"/v1/desktops/" + d.ID, d.SessionID},
	} {
		// A sparse file, far larger than every buffer on the way.
		big := filepath.Join(fn.Dir, c.sessionID, "workspace", "big")
		if err := os.WriteFile(big, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(big, 1<<30); err != nil {
			t.Fatal(err)
		}
		stalledRead(t, e.srv.Listener.Addr().String(), e.key, c.base+"/files?path=big", 1)
		// The caller now reads no more, and stays: the next call waits for the cap's one slot.
		deadline := time.Now().Add(45 * time.Second)
		for {
			r := e.do("GET", c.base+"/files?path=.&list=1", e.key, nil)
			if r.status == 200 {
				break
			}
			if r.status != 429 {
				t.Fatalf("GET %s/files?list=1: %d %s; want a 429 until the stalled read ends, then a 200", c.base, r.status, r.body)
			}
			if time.Now().After(deadline) {
				t.Fatalf("45 s after its caller stopped reading, the read of %s/files still held the project's one file-call slot; want it ended after the 3 s stall", c.base)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestFileReadSteadySlowReaderIsServed: a caller that reads a file steadily, a piece
// (stallwrite.Piece) every 50 ms, 40 pieces a WriteStall, gets the whole file. Before, Linux
// woke a write blocked on the full socket only once about a third of its send buffer (up to
// 4 MB) had drained, so a caller had to take megabytes within the stall, not a piece: it was
// cut mid-file.
func TestFileReadSteadySlowReaderIsServed(t *testing.T) {
	var fn *fakenode.Node
	e := newEnv(t, func(c *Config) {
		fn = c.Guests.(*fakenode.Node)
		c.WriteStall = 2 * time.Second
	})
	s := e.running(map[string]any{"tier": 2})
	const size = 6 << 20
	big := filepath.Join(fn.Dir, s.ID, "workspace", "big")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, size); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(64 << 10) // a slow link's window, not loopback's
	fmt.Fprintf(conn, "GET /v1/sessions/%s/files?path=big HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", s.ID, e.key)
	r := bufio.NewReaderSize(conn, stallwrite.Piece)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "\r\n" {
			break
		}
	}
	start, got := time.Now(), 0
	buf := make([]byte, stallwrite.Piece)
	for got < size { // the body is chunked: its chunks' headers count too, so a whole one reads past size
		n, err := io.ReadFull(r, buf)
		if got += n; err != nil {
			t.Fatalf("a caller reading a piece every 50 ms was cut after %d of %d bytes in %s: %v; want the whole file",
				got, size, time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
