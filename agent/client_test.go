package agent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
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
