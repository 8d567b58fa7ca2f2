package stallwrite

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// serve answers every request with size bytes through a Writer of stall, and sends the
// write's error on done.
func serve(t *testing.T, size int, stall time.Duration, done chan<- error) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		sw := New(w, stall)
		defer sw.Close()
		_, err := sw.Write([]byte(strings.Repeat("x", size)))
		done <- err
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// get sends a request on a connection with a small receive buffer and answers its reader,
// the status line read.
func get(t *testing.T, addr string) *bufio.Reader {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	r := bufio.NewReaderSize(conn, 4<<10)
	if status, err := r.ReadString('\n'); err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("status line %q, %v", status, err)
	}
	return r
}

// TestStalledCallerFails: a write to a caller that takes none of it fails with ErrStalled
// about the stall after the buffers on the way filled.
func TestStalledCallerFails(t *testing.T) {
	done := make(chan error, 1)
	get(t, serve(t, 64<<20, time.Second, done))
	wantStalled(t, done)
}

// wantStalled waits for the server's write, to a caller that reads nothing, to fail with
// ErrStalled (done answers its error).
func wantStalled(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, ErrStalled) {
			t.Fatalf("the write failed with %v; want ErrStalled", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("the write to a caller that reads nothing still waited after 45 s; want it failed after the 1 s stall")
	}
}

// TestSlowCallerServed: a caller that reads slowly, but reads (8 KiB every 100 ms, where a
// piece is 16 KiB and the stall a second), gets the whole answer.
func TestSlowCallerServed(t *testing.T) {
	done := make(chan error, 1)
	const size = 256 << 10
	readSlowly(t, get(t, serve(t, size, time.Second, done)), size, done)
}

// readSlowly reads size bytes from r, 8 KiB every 100 ms, and wants the server's write (done
// answers its error) to have succeeded.
func readSlowly(t *testing.T, r io.Reader, size int, done <-chan error) {
	t.Helper()
	got := 0
	buf := make([]byte, 8<<10)
	for got < size {
		n, err := io.ReadFull(r, buf)
		got += n
		if err != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatalf("the write to a slow caller failed: %v; want it whole", err)
	}
}

// serveHandler serves h through Handler with stall, with ConnContext, and sends on closed
// when a connection of the server's closes.
func serveHandler(t *testing.T, h http.HandlerFunc, stall time.Duration, closed chan<- struct{}) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(Handler(h, stall))
	srv.Config.ConnContext = ConnContext // else the socket queues up to megabytes before a write waits
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			select {
			case closed <- struct{}{}:
			default:
			}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestHandlerCutsStalledLastWrites: small answers, asked for so many times on one connection
// that its caller, who reads none of them, fills it, end about the stall after their
// handler's return: the server closes the connection.
func TestHandlerCutsStalledLastWrites(t *testing.T) {
	closed := make(chan struct{}, 1)
	addr := serveHandler(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }, time.Second, closed)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	go func() { _, _ = conn.Write([]byte(strings.Repeat("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 20000))) }()
	select {
	case <-closed:
	case <-time.After(45 * time.Second):
		t.Fatal("45 s after its caller stopped reading, the connection was still open; want it closed about the 1 s stall after a handler returned")
	}
}

// TestHandlerLeavesOthersAlone: the stall bounds nothing but the writes after the handler's
// return: an answer that waits longer than the stall between its writes is whole, the
// connection's next request, asked for later than the stall, is answered, and a connection
// that a handler hijacked is written after the stall.
func TestHandlerLeavesOthersAlone(t *testing.T) {
	const stall = 500 * time.Millisecond
	hijacked := make(chan error, 1)
	addr := serveHandler(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			_, _ = w.Write([]byte("a\n"))
			_ = http.NewResponseController(w).Flush()
			time.Sleep(2 * stall)
			_, _ = w.Write([]byte("b\n"))
		case "/hijack":
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				hijacked <- err
				return
			}
			go func() { // the connection outlives the handler
				defer conn.Close()
				time.Sleep(2 * stall)
				_, err := conn.Write([]byte("hijacked\n"))
				hijacked <- err
			}()
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	}, stall, make(chan struct{}, 1))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	get := func(path, want string) {
		t.Helper()
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != want {
			t.Fatalf("GET %s: %q, %v; want %q", path, b, err, want)
		}
	}
	get("/slow", "a\nb\n")
	time.Sleep(2 * stall)
	get("/", "ok\n")
	fmt.Fprintf(conn, "GET /hijack HTTP/1.1\r\nHost: x\r\n\r\n")
	if err := <-hijacked; err != nil {
		t.Fatalf("a write to a hijacked connection after the stall: %v; want it written", err)
	}
	if line, err := r.ReadString('\n'); line != "hijacked\n" {
		t.Fatalf("the hijacked connection read %q, %v; want the handler's line", line, err)
	}
}
