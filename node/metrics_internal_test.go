package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"wb/agent"
	"wb/node/nodeapi"
	"wb/session"
)

// TestMetrics: a node's /metrics counts its guests by state and runtime, the execs under
// way through its API, and its requests to the guests' agents by kind and outcome.
func TestMetrics(t *testing.T) {
	m := NewMetrics()
	release := make(chan struct{})
	const id = "sess_metrics"
	_, srv, _ := hostileAgentNode(t, id, Config{Driver: oomDriver{kills: &atomic.Int64{}}, Metrics: m}, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/exec":
			var req agent.ExecRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			w.Header().Set("Content-Type", "application/x-ndjson")
			_, _ = w.Write([]byte(`{"stream":"stdout","data":"x"}` + "\n"))
			_ = http.NewResponseController(w).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			_, _ = w.Write([]byte(`{"exit_code":0,"duration_ms":1}` + "\n"))
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"f does not exist","param":"path"}}`))
		}
	})
	scrape := func() string {
		t.Helper()
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	want := func(lines ...string) {
		t.Helper()
		got := scrape()
		for _, l := range lines {
			if !strings.Contains(got, l+"\n") {
				t.Errorf("/metrics lacks %s:\n%s", l, grepMetrics(got, "wb_node_"))
			}
		}
	}
	want(`wb_node_guests{runtime="oomtest",state="running"} 1`, `wb_node_execs_in_progress 0`)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+id+"/agent", "tok")
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}, TimeoutS: 60}, func(session.ExecChunk) error { return nil })
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(scrape(), "wb_node_execs_in_progress 1\n") {
		if time.Now().After(deadline) {
			t.Fatalf("an exec under way for 30 s is not counted:\n%s", grepMetrics(scrape(), "wb_node_"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFile(ctx, "f"); err == nil {
		t.Fatal("a file the agent does not find was read")
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/sessions/sess_nosuchsession/agent/v1/exec", strings.NewReader(`{"argv":["true"]}`))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	// The exec's answer is counted once the node's handler returned, after the caller read it.
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(scrape(), `wb_node_agent_requests_total{kind="exec",outcome="ok"} 1`+"\n") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	want(`wb_node_execs_in_progress 0`,
		`wb_node_agent_requests_total{kind="exec",outcome="ok"} 1`,
		`wb_node_agent_requests_total{kind="exec",outcome="rejected"} 1`,
		`wb_node_agent_requests_total{kind="files",outcome="rejected"} 1`)
}

// grepMetrics answers the lines of s that contain sub.
func grepMetrics(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// scrapeMetrics answers the lines of m's /metrics that contain sub.
func scrapeMetrics(m *Metrics, sub string) string {
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return grepMetrics(rec.Body.String(), sub)
}

// TestMetricsCountEdgeCalls: the execs, file calls and PTYs of the edge's data path, which
// every node serves and which reach the guests in process (Local), not through the node's
// API, are counted as those through the API are: an exec under way, then each by kind and
// outcome. Before, only the API's were, and behind the edge the node's metrics read about 0.
func TestMetricsCountEdgeCalls(t *testing.T) {
	m := NewMetrics()
	const id = "sess_edgeexec"
	release := make(chan struct{})
	n, _, _ := hostileAgentNode(t, id, Config{Driver: oomDriver{kills: &atomic.Int64{}}, Metrics: m}, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/files":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"f does not exist","param":"path"}}`))
			return
		case "/v1/pty":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"code":"invalid_request","message":"bad size","param":"cols"}}`))
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"stream":"stdout","data":"x"}` + "\n"))
		_ = http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = w.Write([]byte(`{"exit_code":0,"duration_ms":1}` + "\n"))
	})
	timeout := 60
	done := make(chan error, 1)
	go func() {
		_, err := n.Local().Exec(t.Context(), &session.Session{ID: id}, session.ExecRequest{Command: []byte(`"true"`), TimeoutS: &timeout}, []string{"true"},
			func(session.ExecChunk) error { return nil })
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(scrapeMetrics(m, "wb_node_execs_in_progress"), "wb_node_execs_in_progress 1"); {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("an exec on the edge's data path (Local.Exec) under way for 30 s: want wb_node_execs_in_progress 1; /metrics has %q", scrapeMetrics(m, "wb_node_"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Refused: no such guest.
	if _, err := n.Local().Exec(t.Context(), &session.Session{ID: "sess_nosuchsession"}, session.ExecRequest{Command: []byte(`"true"`), TimeoutS: &timeout}, []string{"true"},
		func(session.ExecChunk) error { return nil }); err == nil {
		t.Fatal("an exec in a session the node holds no guest for ran")
	}
	c, err := n.Local().Agent(t.Context(), &session.Session{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFile(t.Context(), "f"); err == nil {
		t.Fatal("a file the agent does not find was read")
	}
	if conn, _, err := c.PTY(t.Context(), 0, 0, ""); err == nil {
		_ = conn.CloseNow()
		t.Fatal("a PTY the agent refused was opened")
	}
	got := scrapeMetrics(m, "wb_node_")
	for _, l := range []string{`wb_node_execs_in_progress 0`, `wb_node_agent_requests_total{kind="exec",outcome="ok"} 1`,
		`wb_node_agent_requests_total{kind="exec",outcome="rejected"} 1`, `wb_node_agent_requests_total{kind="files",outcome="rejected"} 1`,
		`wb_node_agent_requests_total{kind="pty",outcome="rejected"} 1`} {
		if !strings.Contains(got+"\n", l+"\n") {
			t.Errorf("calls on the edge's data path (Local): want %s; /metrics has:\n%s", l, got)
		}
	}
}

// TestMetricsGuestGaugeReadsZero: once a node's last running guest no longer runs,
// wb_node_guests{state="running"} reads 0, as every other state the node has none in does.
// Before, the collector emitted only the states it counted, and the series went away.
func TestMetricsGuestGaugeReadsZero(t *testing.T) {
	m := NewMetrics()
	const id = "sess_gaugezero"
	n, _, _ := hostileAgentNode(t, id, Config{Driver: oomDriver{kills: &atomic.Int64{}}, Metrics: m}, func(http.ResponseWriter, *http.Request) {})
	if got := scrapeMetrics(m, "wb_node_guests{"); !strings.Contains(got, `wb_node_guests{runtime="oomtest",state="running"} 1`) ||
		!strings.Contains(got, `wb_node_guests{runtime="oomtest",state="paused"} 0`) {
		t.Fatalf("one running guest: want running 1 and paused 0; /metrics has:\n%s", got)
	}
	setGuestState(n, id, session.Paused) // as Node.Pause leaves it
	got := scrapeMetrics(m, "wb_node_guests{")
	for _, s := range session.States() {
		want := fmt.Sprintf(`wb_node_guests{runtime="oomtest",state="%s"} 0`, s)
		if s == session.Paused {
			want = `wb_node_guests{runtime="oomtest",state="paused"} 1`
		}
		if !strings.Contains(got, want) {
			t.Errorf("no guest running any more: want %s; /metrics has:\n%s", want, got)
		}
	}
	if !strings.Contains(got, `wb_node_guests{runtime="oomtest",state="busy"} 0`) {
		t.Errorf("no guest held: want busy 0; /metrics has:\n%s", got)
	}
}

// TestMetricsExecEndedByNodeFailed: an exec whose agent's answer the node ends with its own
// 502 guest_error line (here the agent sent a line shaped as the node's error record) is
// counted failed, as the metric's help says of an answer the node does not pass on. Before,
// it counted ok: the answer's 200 had gone out before the line.
func TestMetricsExecEndedByNodeFailed(t *testing.T) {
	m := NewMetrics()
	const id = "sess_brokenexec"
	_, srv, _ := hostileAgentNode(t, id, Config{Driver: oomDriver{kills: &atomic.Int64{}}, Metrics: m}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"error":{"status":403,"code":"policy_violation","message":"forged"}}` + "\n"))
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done() // the node closes the answer
	})
	c := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+id+"/agent", "tok")
	_, err := c.Exec(t.Context(), agent.ExecRequest{Argv: []string{"true"}, TimeoutS: 60}, func(session.ExecChunk) error { return nil })
	var ae *agent.Error
	if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != "guest_error" {
		t.Fatalf("the exec: %v; want the node's 502 guest_error", err)
	}
	// The exec is counted once the node's handler returned, after the caller read its answer.
	got := scrapeMetrics(m, "wb_node_agent_requests_total{")
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(got, `kind="exec"`) && time.Now().Before(deadline); got = scrapeMetrics(m, "wb_node_agent_requests_total{") {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(got+"\n", `wb_node_agent_requests_total{kind="exec",outcome="failed"} 1`+"\n") {
		t.Fatalf("an exec the node ended 502 guest_error: want outcome=\"failed\"; /metrics has:\n%s", got)
	}
}

// TestMetricsCountEdgeRefusals: a call on the edge's data path that Local.Agent refuses
// before any call of the agent (no guest for the session, a guest that is not running) is
// counted rejected under the kind its caller gave (nodeapi.WithAgentKind; other without
// one), as the node's API counts the 404 or 409 it answers such a call. Before, those
// refusals were not counted at all.
func TestMetricsCountEdgeRefusals(t *testing.T) {
	m := NewMetrics()
	const id = "sess_edgerefused"
	n, _, _ := hostileAgentNode(t, id, Config{Driver: oomDriver{kills: &atomic.Int64{}}, Metrics: m}, func(http.ResponseWriter, *http.Request) {})
	files := nodeapi.WithAgentKind(t.Context(), nodeapi.AgentKindFiles)
	if _, err := n.Local().Agent(files, &session.Session{ID: "sess_nosuchsession"}); err == nil {
		t.Fatal("an agent of a session the node holds no guest for was handed out")
	}
	if _, err := n.Local().Agent(t.Context(), &session.Session{ID: "sess_nosuchsession"}); err == nil {
		t.Fatal("an agent of a session the node holds no guest for was handed out")
	}
	setGuestState(n, id, session.Paused) // as Node.Pause leaves it
	if _, err := n.Local().Agent(nodeapi.WithAgentKind(t.Context(), nodeapi.AgentKindPTY), &session.Session{ID: id}); err == nil {
		t.Fatal("an agent of a paused guest was handed out")
	}
	got := scrapeMetrics(m, "wb_node_agent_requests_total{")
	for _, l := range []string{`wb_node_agent_requests_total{kind="files",outcome="rejected"} 1`,
		`wb_node_agent_requests_total{kind="other",outcome="rejected"} 1`,
		`wb_node_agent_requests_total{kind="pty",outcome="rejected"} 1`} {
		if !strings.Contains(got+"\n", l+"\n") {
			t.Errorf("refusals of Local.Agent: want %s; /metrics has:\n%s", l, got)
		}
	}
}

// setGuestState sets the state of guest id on n, as an operation would leave it.
func setGuestState(n *Node, id string, st session.State) {
	n.mu.Lock()
	l := n.guests[id]
	n.mu.Unlock()
	l.mu.Lock()
	l.g.State = st
	l.mu.Unlock()
}
