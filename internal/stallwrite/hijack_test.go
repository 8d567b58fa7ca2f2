package stallwrite

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// serveHijacked answers every request by hijacking its connection through a Hijacker of
// stall, writing the status line and headers, waiting idle (past the stall: a deadline left
// passed must not fail the next write), then size bytes; it sends the write's error and
// whether the Hijacker saw it stall on done.
func serveHijacked(t *testing.T, size int, stall, idle time.Duration, done chan<- error) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hj := NewHijacker(w, stall)
		c, brw, err := http.NewResponseController(hj).Hijack()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
		if err := brw.Flush(); err != nil {
			done <- err
			return
		}
		time.Sleep(idle)
		_, err = c.Write([]byte(strings.Repeat("x", size)))
		if errors.Is(err, ErrStalled) != hj.Stalled() {
			err = errors.New("the Hijacker's Stalled does not agree with the write's error")
		}
		done <- err
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestHijackedStalledCallerFails: a write to a hijacked connection whose caller takes none of
// it fails with ErrStalled about the stall after the buffers on the way filled.
func TestHijackedStalledCallerFails(t *testing.T) {
	done := make(chan error, 1)
	get(t, serveHijacked(t, 64<<20, time.Second, 0, done))
	wantStalled(t, done)
}

// TestHijackedSlowCallerServed: a hijacked connection idle for longer than the stall, then
// written to a caller that reads slowly, but reads (8 KiB every 100 ms, where a piece is
// 16 KiB and the stall a second), gives it the whole answer.
func TestHijackedSlowCallerServed(t *testing.T) {
	done := make(chan error, 1)
	const size = 256 << 10
	readSlowly(t, get(t, serveHijacked(t, size, time.Second, 2*time.Second, done)), size, done)
}
