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
	r := get(t, serve(t, size, time.Second, done))
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
