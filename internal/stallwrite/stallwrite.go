// Package stallwrite bounds how long an HTTP answer may wait on a caller that stays connected
// but takes none of it: an exec's streamed answer, which otherwise holds the exec (its
// handler, its proxy, the command in the guest) for as long as such a caller likes.
package stallwrite

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

// Piece is the most a Writer writes (and flushes) at once: a caller that takes less than a
// piece within the stall is taken for one that stopped.
const Piece = 16 << 10

// ErrStalled is the error of a write that made no progress within the stall.
var ErrStalled = errors.New("the caller took none of the answer")

// Writer is an http.ResponseWriter whose writes and flushes each end within stall: it writes
// in pieces of at most Piece bytes, flushing each, and a piece that the caller does not take
// within stall fails the write (and every one after it) with ErrStalled; the server then
// closes the connection. A caller that reads slowly, but reads, is served as long as it
// reads. No deadline is left set on the connection (the server reuses it): a timer sets a
// passed one only on a write that stalls, which unblocks it. A piece's write waits on the
// caller's taking a piece only on a server whose ConnContext is this package's; on others it
// waits for a third of the socket's send buffer to drain.
type Writer struct {
	http.ResponseWriter
	rc      *http.ResponseController
	stall   time.Duration
	timer   *time.Timer
	stalled atomic.Bool
}

// New wraps w; a stall of 0 or less leaves writes unbounded.
func New(w http.ResponseWriter, stall time.Duration) *Writer {
	s := &Writer{ResponseWriter: w, rc: http.NewResponseController(w), stall: stall}
	if stall > 0 {
		s.timer = time.AfterFunc(time.Hour, func() {
			s.stalled.Store(true)
			_ = s.rc.SetWriteDeadline(time.Now()) // unblocks the write under way
		})
		s.timer.Stop()
	}
	return s
}

// Stalled reports whether a write stalled.
func (s *Writer) Stalled() bool { return s.stalled.Load() }

// guard runs f under the stall's timer.
func (s *Writer) guard(f func() error) error {
	if s.stalled.Load() {
		return s.err()
	}
	if s.timer == nil {
		return f()
	}
	s.timer.Reset(s.stall)
	err := f()
	if !s.timer.Stop() || s.stalled.Load() {
		return s.err()
	}
	return err
}

func (s *Writer) err() error {
	return fmt.Errorf("%w within %s", ErrStalled, s.stall)
}

// Write writes b in pieces, each flushed to the caller.
func (s *Writer) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		p := b[:min(len(b), Piece)]
		err := s.guard(func() error {
			n, err := s.ResponseWriter.Write(p)
			written += n
			if err != nil {
				return err
			}
			return s.flush()
		})
		if err != nil {
			return written, err
		}
		b = b[len(p):]
	}
	return written, nil
}

// FlushError flushes within the stall (http.ResponseController calls it).
func (s *Writer) FlushError() error {
	return s.guard(s.flush)
}

// flush flushes what was written, if the server's writer can.
func (s *Writer) flush() error {
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// Flush is FlushError for an http.Flusher's callers.
func (s *Writer) Flush() { _ = s.FlushError() }

// Unwrap lets http.ResponseController reach the server's writer.
func (s *Writer) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Close stops the timer; call it once the answer's writes are done.
func (s *Writer) Close() {
	if s.timer != nil {
		s.timer.Stop()
	}
}

// Handler serves h, then bounds by stall the writes that net/http makes of the answer once h
// returned: the rest of its buffers, a chunked answer's end. The server has no WriteTimeout
// (answers stream for long), and a caller that pipelines requests on a connection and reads
// nothing fills its socket: even a small answer's last write would then hold the connection,
// and its goroutine, for as long as the caller stayed. The deadline is set only once h
// returned, so it cuts no answer of h's (a Writer bounds those), and net/http clears it once
// the answer is written, so the connection's next request has none. A hijacked connection (a
// WebSocket) is its handler's, and is left alone. A stall of 0 or less leaves them unbounded.
func Handler(h http.Handler, stall time.Duration) http.Handler {
	if stall <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		// A write of nothing answers ErrHijacked on a hijacked connection, and does nothing
		// else; on another it writes the status 200 if h wrote none, as net/http does next.
		if _, err := w.Write(nil); errors.Is(err, http.ErrHijacked) {
			return
		}
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(stall))
	})
}
