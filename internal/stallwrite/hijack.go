package stallwrite

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// Conn is a connection (a hijacked one, a WebSocket's that a proxy passes on; a client's to
// a peer that may stop reading) whose writes each end within stall, as a Writer's do: it
// writes in pieces of at most Piece bytes, and a piece that the peer does not take within
// stall fails the write with ErrStalled. The connection's writes are its holder's alone, so
// a deadline is set before each piece and left (a passed one hinders nothing: the next write
// sets its own); reads are not bounded.
type Conn struct {
	net.Conn
	stall   time.Duration
	stalled atomic.Bool
}

// NewConn wraps c, a connection its holder alone writes to; a stall of 0 or less leaves its
// writes unbounded.
func NewConn(c net.Conn, stall time.Duration) *Conn {
	return &Conn{Conn: c, stall: stall}
}

// Write writes b in pieces, each within the stall.
func (c *Conn) Write(b []byte) (int, error) {
	if c.stall <= 0 {
		return c.Conn.Write(b)
	}
	written := 0
	for len(b) > 0 {
		if c.stalled.Load() {
			return written, c.err(nil)
		}
		p := b[:min(len(b), Piece)]
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.stall))
		n, err := c.Conn.Write(p)
		written += n
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.stalled.Store(true)
			return written, c.err(err)
		}
		if err != nil {
			return written, err
		}
		b = b[len(p):]
	}
	return written, nil
}

func (c *Conn) err(cause error) error {
	if cause == nil {
		return fmt.Errorf("%w within %s", ErrStalled, c.stall)
	}
	return fmt.Errorf("%w within %s: %w", ErrStalled, c.stall, cause)
}

// CloseWrite ends the connection's writing half, where it has one (a proxy ends it once the
// other side's stream ended, and waits for the rest).
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// Stalled reports whether a write stalled.
func (c *Conn) Stalled() bool { return c.stalled.Load() }

// Hijacker is an http.ResponseWriter whose hijacked connection is a Conn: a handler that
// hands its writer to one that hijacks it (httputil.ReverseProxy, switching to a WebSocket)
// has the connection's writes bounded by stall. The hijacker's first writes, through the
// bufio.ReadWriter (an upgrade's answer), have the stall from the hijack to end.
type Hijacker struct {
	http.ResponseWriter
	stall time.Duration
	conn  atomic.Pointer[Conn]
}

// NewHijacker wraps w; a stall of 0 or less leaves the hijacked connection's writes
// unbounded.
func NewHijacker(w http.ResponseWriter, stall time.Duration) *Hijacker {
	return &Hijacker{ResponseWriter: w, stall: stall}
}

// Hijack hijacks the server's connection, and answers it as a Conn.
func (h *Hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil || h.stall <= 0 {
		return c, brw, err
	}
	_ = c.SetWriteDeadline(time.Now().Add(h.stall))
	sc := NewConn(c, h.stall)
	h.conn.Store(sc)
	return sc, brw, nil
}

// Stalled reports whether a write to the hijacked connection stalled (not one through the
// bufio.ReadWriter, which writes to the server's connection itself).
func (h *Hijacker) Stalled() bool {
	c := h.conn.Load()
	return c != nil && c.Stalled()
}

// Unwrap lets http.ResponseController reach the server's writer.
func (h *Hijacker) Unwrap() http.ResponseWriter { return h.ResponseWriter }
