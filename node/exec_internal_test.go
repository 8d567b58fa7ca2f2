package node

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor/templates"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// TestExecBackstopEndsAnUnansweredExec: an exec whose agent never answers (neither its
// status, nor its result after some output, nor the end of an output that goes on) ends at its timeout and the node's grace with an
// error that says so, in process (Node.Exec) and through the node's API; the node closes its
// request to the agent then, which makes the agent kill the command's processes as its
// timeout does. Before, each waited for ever.
func TestExecBackstopEndsAnUnansweredExec(t *testing.T) {
	dir, err := os.MkdirTemp("", "wbx") // t.TempDir's is too long for the guests' sockets
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	n, err := New(Config{Store: store.New(redistest.Server(t)), Driver: countersOnly{}, Templates: templates.Catalog{"tpl": {}},
		DataDir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	close(n.recovered)
	t.Cleanup(n.cancel)
	n.execGrace = 300 * time.Millisecond

	// The guest's agent: it takes an exec, sends its status and one line of output when
	// talkFirst, and then nothing; it counts the execs whose connection the node closed.
	const id, guestID = "sess_unanswered", "g_unanswered"
	sock := filepath.Join(n.guestDir(guestID), "agent", "agent.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var talkFirst, trickle atomic.Bool
	closed := make(chan struct{}, 4)
	deaf := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req agent.ExecRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		if talkFirst.Load() {
			w.Header().Set("Content-Type", "application/x-ndjson")
			_, _ = w.Write([]byte(`{"stream":"stdout","data":"started\n"}` + "\n"))
			http.NewResponseController(w).Flush()
		}
		// An agent that never finishes its answer: a line every 50 ms, for ever.
		for trickle.Load() {
			select {
			case <-r.Context().Done():
				closed <- struct{}{}
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := w.Write([]byte(`{"stream":"stdout","data":"more\n"}` + "\n")); err != nil {
				closed <- struct{}{}
				return
			}
			http.NewResponseController(w).Flush()
		}
		select {
		case <-r.Context().Done():
			closed <- struct{}{}
		case <-time.After(time.Minute):
		}
	})}
	go func() { _ = deaf.Serve(ln) }()
	t.Cleanup(func() { _ = deaf.Close() })
	l := &live{g: &guest{SessionID: id, Project: "proj_unanswered", GuestID: guestID, State: session.Running, Template: "tpl",
		StartedAt: time.Now(), IdleTimeoutS: 600, MaxLifetimeS: 600}, agent: agent.NewClient(sock)}
	t.Cleanup(l.agent.Close)
	n.guests[id] = l

	timeout := 1
	within := func(what string, start time.Time) {
		t.Helper()
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%s: answered after %s; want about its 1 s timeout and the 300 ms grace", what, took)
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Errorf("%s: the node's request to the agent stayed open (the agent kills the command's processes when it closes)", what)
		}
	}
	wantUnanswered := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "did not answer the exec within its timeout of 1 s") {
			t.Errorf("%s: %v; want an error saying the agent did not answer within the exec's timeout", what, err)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err = n.Exec(ctx, &session.Session{ID: id}, session.ExecRequest{Command: json.RawMessage(`"sleep 600"`), TimeoutS: &timeout}, nil, nil)
	wantUnanswered("Node.Exec", err)
	within("Node.Exec", start)

	srv := httptest.NewServer(n.Handler("tok"))
	t.Cleanup(srv.Close)
	c := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+id+"/agent", "tok")
	for i, talk := range []bool{false, true, true} {
		talkFirst.Store(talk)
		trickle.Store(i == 2)
		what := "through the node's API, an agent silent from the start"
		switch {
		case i == 2:
			what = "through the node's API, an agent whose output never ends"
		case talk:
			what = "through the node's API, an agent silent after some output"
		}
		start := time.Now()
		_, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"sleep", "600"}, TimeoutS: timeout}, nil)
		var ae *agent.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway {
			t.Errorf("%s: %v; want a 502 from the node", what, err)
		}
		wantUnanswered(what, err)
		within(what, start)
	}
}

// TestExecBackstopSparesASlowReader: the backstop is the agent's: an exec whose agent
// answered in time, but whose caller stopped reading its output for longer than the exec's
// timeout and the grace, is not ended by it, and its caller reads the whole answer, its
// result included, once it reads again, in process (Node.Exec) and through the node's API.
// Before, the node ended it past its timeout and grace, saying the agent did not answer.
func TestExecBackstopSparesASlowReader(t *testing.T) {
	dir, err := os.MkdirTemp("", "wbx") // t.TempDir's is too long for the guests' sockets
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	n, err := New(Config{Store: store.New(redistest.Server(t)), Driver: countersOnly{}, Templates: templates.Catalog{"tpl": {}},
		DataDir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	close(n.recovered)
	t.Cleanup(n.cancel)
	// The agent's budget, 4 s, also holds the node's own work on the 32 MiB below, which
	// took over 1.3 s under -race on a loaded machine (502 agent_unreachable).
	n.execGrace = 3 * time.Second

	// The guest's agent answers every exec at once: lines lines of output (enough, through
	// the node's API, to fill the sockets' buffers on the way to a caller that does not
	// read), then its result a moment later.
	const id, guestID = "sess_slowreader", "g_slowreader"
	sock := filepath.Join(n.guestDir(guestID), "agent", "agent.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var lines atomic.Int64
	data := strings.Repeat("x", 16<<10)
	prompt := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req agent.ExecRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/x-ndjson")
		for range lines.Load() {
			if _, err := w.Write([]byte(`{"stream":"stdout","data":"` + data + `"}` + "\n")); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
		}
		time.Sleep(100 * time.Millisecond)
		_, _ = w.Write([]byte(`{"exit_code":7,"duration_ms":100}` + "\n"))
	})}
	go func() { _ = prompt.Serve(ln) }()
	t.Cleanup(func() { _ = prompt.Close() })
	l := &live{g: &guest{SessionID: id, Project: "proj_slowreader", GuestID: guestID, State: session.Running, Template: "tpl",
		StartedAt: time.Now(), IdleTimeoutS: 600, MaxLifetimeS: 600}, agent: agent.NewClient(sock)}
	t.Cleanup(l.agent.Close)
	n.guests[id] = l

	timeout := 1
	const stall = 5 * time.Second // past the timeout and the grace
	// slow is a caller's output: it stops reading at the first line for stall, and counts.
	slow := func(got *atomic.Int64) func(session.ExecChunk) error {
		return func(ch session.ExecChunk) error {
			if got.Add(int64(strings.Count(ch.Data, "x"))) == int64(len(data)) {
				time.Sleep(stall)
			}
			return nil
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	lines.Store(1)
	var got atomic.Int64
	res, err := n.Exec(ctx, &session.Session{ID: id}, session.ExecRequest{Command: json.RawMessage(`"true"`), TimeoutS: &timeout}, nil, slow(&got))
	if err != nil || res.ExitCode != 7 {
		t.Errorf("Node.Exec, its caller reading late: %+v, %v; want the agent's result, exit code 7", res, err)
	}

	srv := httptest.NewServer(n.Handler("tok"))
	t.Cleanup(srv.Close)
	c := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+id+"/agent", "tok")
	lines.Store(2048) // 32 MiB
	got.Store(0)
	res, err = c.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}, TimeoutS: timeout}, slow(&got))
	if err != nil || res.ExitCode != 7 || got.Load() != 2048*int64(len(data)) {
		t.Errorf("through the node's API, its caller reading late: %+v, %v, %d bytes of output; want the agent's result, exit code 7, and its %d bytes",
			res, err, got.Load(), 2048*len(data))
	}
}
