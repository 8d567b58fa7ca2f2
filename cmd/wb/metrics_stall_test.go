//go:build linux

package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"wb/node"
)

// closeSignalListener sends on closed when a connection it accepted is closed.
type closeSignalListener struct {
	net.Listener
	closed chan<- struct{}
}

func (l closeSignalListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &closeSignalConn{Conn: c, closed: l.closed}, nil
}

type closeSignalConn struct {
	net.Conn
	closed chan<- struct{}
	once   sync.Once
}

func (c *closeSignalConn) Close() error {
	c.once.Do(func() {
		select {
		case c.closed <- struct{}{}:
		default:
		}
	})
	return c.Conn.Close()
}

// TestMetricsStalledCallerIsCut: the operator's /metrics listener (wb node's, wb serve's),
// asked for /metrics so many times on one connection that its caller, who takes none of the
// answers, fills the connection, closes it once a write waited the stall. Before, the
// scrape's handler (or net/http's last write of its answer) held the connection, its
// goroutine and the answer for as long as the caller stayed.
func TestMetricsStalledCallerIsCut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(ctx)
	serveMetrics(gctx, g, closeSignalListener{Listener: ln, closed: closed}, node.NewMetrics().Handler(), time.Second,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("serving /metrics: %v", err)
		}
	})

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	req := "GET /metrics HTTP/1.1\r\nHost: metrics\r\n\r\n"
	go func() { _, _ = conn.Write([]byte(strings.Repeat(req, 5000))) }() // ends when the connection closes
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("the answer's status line: %q, %v; want a 200", status, err)
	}
	// The caller now reads no more, and stays.
	select {
	case <-closed:
	case <-time.After(45 * time.Second):
		t.Fatal("45 s after its caller stopped reading, the connection asking for /metrics was still open; want it closed after the 1 s stall")
	}
}
