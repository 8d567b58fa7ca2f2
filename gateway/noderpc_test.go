package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"wb/agent"
	"wb/internal/fakenode"
	"wb/node/client"
	"wb/node/nodeapi"
	"wb/session"
)

// TestPatchNodeRefuses: a PATCH whose node cannot apply the new timers answers an error (a
// refusal with its status and code, a failed node as a scrubbed 502), and the session keeps
// the timers the node enforces; once the node applies them, the store has them too.
func TestPatchNodeRefuses(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	enforced, ok := e.node.EnforcedTimers(s.ID)
	if !ok || enforced.MaxLifetimeS != s.MaxLifetimeS || enforced.IdleTimeoutS != s.IdleTimeoutS {
		t.Fatalf("the node enforces %+v (%v), the store holds idle %d life %d", enforced, ok, s.IdleTimeoutS, s.MaxLifetimeS)
	}
	// keeps checks that the store still holds the timers the node enforces.
	keeps := func(when string) {
		t.Helper()
		var got session.Session
		e.mustDo("GET", "/v1/sessions/"+s.ID, e.key, nil, 200, &got)
		now, _ := e.node.EnforcedTimers(s.ID)
		if got.MaxLifetimeS != now.MaxLifetimeS || got.IdleTimeoutS != now.IdleTimeoutS || now != enforced ||
			!got.ExpiresAt.Equal(s.ExpiresAt.Time) {
			t.Fatalf("%s: the store holds idle %d life %d expires %v; the node enforces %+v; before: %+v expires %v",
				when, got.IdleTimeoutS, got.MaxLifetimeS, got.ExpiresAt, now, enforced, s.ExpiresAt)
		}
	}
	patch := map[string]any{"max_lifetime_s": 7200, "idle_timeout_s": 600}

	e.node.SetRetimeError(fmt.Errorf("node node_fake: %w", &nodeapi.Error{Status: 409, Code: nodeapi.CodeInvalidState,
		Message: "node: session " + s.ID + " is stopping here; its timers can no longer change"}))
	msg := expectError(t, e.do("PATCH", "/v1/sessions/"+s.ID, e.key, patch), 409, "invalid_state", "")
	if !strings.Contains(msg, "stopping") {
		t.Errorf("409 message %q: want it to name the node's state", msg)
	}
	keeps("after a 409 from the node")

	e.node.SetRetimeError(fmt.Errorf("node node_fake: %w", &nodeapi.Error{Status: 404, Code: nodeapi.CodeNotFound,
		Message: "node: no guest for session " + s.ID}))
	expectError(t, e.do("PATCH", "/v1/sessions/"+s.ID, e.key, patch), 404, "not_found", "")
	keeps("after a 404 from the node")

	// A node that fails, or cannot be reached, is a 502 that names neither paths nor addresses.
	for _, err := range []error{
		fmt.Errorf("node node_fake: %w", &nodeapi.Error{Status: 500, Code: nodeapi.CodeInternal,
			Message: "journal " + s.ID + ": open /var/lib/wb/journal/" + s.ID + ".json.tmp: no space left on device"}),
		errors.New(`node node_fake: Post "http://10.9.8.7:7070/v1/sessions/x:retime": dial tcp 10.9.8.7:7070: connect: connection refused`),
	} {
		e.node.SetRetimeError(err)
		msg := expectError(t, e.do("PATCH", "/v1/sessions/"+s.ID, e.key, patch), 502, "node_error", "")
		if strings.Contains(msg, "/var/lib") || strings.Contains(msg, "10.9.8.7") {
			t.Errorf("502 message %q leaks a host path or address", msg)
		}
		keeps("after " + err.Error())
	}

	e.node.SetRetimeError(nil)
	var got session.Session
	e.mustDo("PATCH", "/v1/sessions/"+s.ID, e.key, patch, 200, &got)
	now, _ := e.node.EnforcedTimers(s.ID)
	if got.MaxLifetimeS != 7200 || got.IdleTimeoutS != 600 || now != (fakenode.Timers{IdleTimeoutS: 600, MaxLifetimeS: 7200}) {
		t.Fatalf("applied: the store holds idle %d life %d, the node enforces %+v", got.IdleTimeoutS, got.MaxLifetimeS, now)
	}
}

// TestPatchPendingSkipsNode: a session not placed yet has no node to tell; the store alone
// takes its timers (the placer hands them to the node it picks).
func TestPatchPendingSkipsNode(t *testing.T) {
	e := newEnv(t)
	e.node.SetRetimeError(errors.New("the node must not be asked"))
	// Regions: "far" has no node, so the session stays pending.
	s := e.create(e.key, map[string]any{"tier": 2, "region": "far"})
	var got session.Session
	e.mustDo("PATCH", "/v1/sessions/"+s.ID, e.key, map[string]any{"idle_timeout_s": 600}, 200, &got)
	if got.IdleTimeoutS != 600 || got.State != session.Pending {
		t.Fatalf("patched %+v", got)
	}
	for _, c := range e.node.Calls() {
		if c == "retime:"+s.ID {
			t.Fatalf("the node was asked to retime a session it does not hold: %v", e.node.Calls())
		}
	}
}

// stubNode is a node that refuses every action with the answer its refuse function gives,
// recording each request, for the gateway's real node client.
type stubNode struct {
	refuse func(action, sessionID string) *nodeapi.Error

	mu      sync.Mutex
	retimes []nodeapi.RetimeRequest
}

func (n *stubNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, action, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/sessions/"), ":")
	if action == nodeapi.ActionRetime {
		var req nodeapi.RetimeRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		n.mu.Lock()
		n.retimes = append(n.retimes, req)
		n.mu.Unlock()
	}
	e := n.refuse(action, id)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(nodeapi.ErrorBody{Error: e})
}

// TestNodeRefusalThroughClient: a node's error answer reaches the API caller through the
// real node client with its status and code: a 409 is a 409 naming the node's state, a 404 a
// 404; a node's 500 stays a 502 that names no host path.
func TestNodeRefusalThroughClient(t *testing.T) {
	stub := &stubNode{refuse: func(action, id string) *nodeapi.Error {
		switch action {
		case nodeapi.ActionRetime, nodeapi.ActionPause:
			return &nodeapi.Error{Status: 409, Code: nodeapi.CodeInvalidState, Message: "node: session " + id + " is paused here"}
		case nodeapi.ActionSnapshot:
			return &nodeapi.Error{Status: 500, Code: nodeapi.CodeInternal, Message: "checkpoint: open /var/lib/wb/snapshots/x: no space left on device"}
		}
		return &nodeapi.Error{Status: 404, Code: nodeapi.CodeNotFound, Message: "node: no guest for session " + id}
	}}
	e, s := sessionOnStub(t, stub)

	msg := expectError(t, e.do("PATCH", "/v1/sessions/"+s.ID, e.key, map[string]any{"idle_timeout_s": 600, "max_lifetime_s": 7200}), 409, "invalid_state", "")
	if !strings.Contains(msg, "paused") {
		t.Errorf("PATCH's 409 %q: want it to name the node's state", msg)
	}
	stub.mu.Lock()
	if len(stub.retimes) != 1 || stub.retimes[0] != (nodeapi.RetimeRequest{IdleTimeoutS: 600, MaxLifetimeS: 7200}) {
		t.Errorf("the node received %+v, want one RetimeRequest{600, 7200}", stub.retimes)
	}
	stub.mu.Unlock()
	var got session.Session
	e.mustDo("GET", "/v1/sessions/"+s.ID, e.key, nil, 200, &got)
	if got.IdleTimeoutS != s.IdleTimeoutS || got.MaxLifetimeS != s.MaxLifetimeS {
		t.Errorf("the refused PATCH changed the stored timers: idle %d life %d", got.IdleTimeoutS, got.MaxLifetimeS)
	}

	msg = expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":pause", e.key, nil), 409, "invalid_state", "")
	if !strings.Contains(msg, "paused") {
		t.Errorf("pause's 409 %q: want it to name the node's state", msg)
	}
	msg = expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, nil), 502, "snapshot_failed", "")
	if strings.Contains(msg, "/var/lib") {
		t.Errorf("snapshot's 502 %q leaks a host path", msg)
	}
	// The failed snapshot, read later, says why, as its request was answered.
	var snaps struct {
		Data []session.Snapshot `json:"data"`
	}
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &snaps)
	if len(snaps.Data) != 1 || snaps.Data[0].State != session.SnapshotFailed || snaps.Data[0].FailureReason != msg {
		t.Errorf("the snapshots after the failed one: %+v; want it failed, its failure_reason %q", snaps.Data, msg)
	}
}

// stoppingNode is a fake node whose guests are stopping there while the store still says
// running: its proxy to the agent answers 409 invalid_state, as the node's handler does.
type stoppingNode struct {
	*fakenode.Node
	proxy *httptest.Server
}

func (n stoppingNode) Agent(context.Context, *session.Session) (*agent.Client, error) {
	return agent.NewHTTPClient(http.DefaultClient, n.proxy.URL, ""), nil
}

func (n stoppingNode) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, _ []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	c, _ := n.Agent(ctx, s)
	return c.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}}, out)
}

// TestNodeProxyRefusal: files and exec on a guest the node says is not running answer 409
// naming the node's state, not a 400 about the path or a 502.
func TestNodeProxyRefusal(t *testing.T) {
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(nodeapi.ErrorBody{Error: &nodeapi.Error{Code: nodeapi.CodeInvalidState, Message: "node: session sess_x is stopping here"}})
	}))
	t.Cleanup(proxy.Close)
	e := newEnv(t, func(c *Config) { c.Guests = stoppingNode{Node: c.Guests.(*fakenode.Node), proxy: proxy} })
	s := e.running(map[string]any{"tier": 2})
	for _, r := range []response{
		e.do("GET", "/v1/sessions/"+s.ID+"/files?path=a.txt", e.key, nil),
		e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"}),
	} {
		if msg := expectError(t, r, 409, "invalid_state", ""); !strings.Contains(msg, "stopping") {
			t.Errorf("409 message %q: want it to name the node's state", msg)
		}
	}
}

// TestSnapshotFailureReasonBounded: a node whose snapshot fails with an error of many KB (a
// runsc's output, say) does not have it stored whole as the failed snapshot's failure_reason,
// answered in every list of the project's snapshots, nor answered whole to the request: the
// message is cut, whole runes, and says it was.
func TestSnapshotFailureReasonBounded(t *testing.T) {
	long := "checkpoint: runsc: " + strings.Repeat("sentry said 日本 ", 2500) // 55 KB: within what the node client reads of an error (64 KiB)
	stub := &stubNode{refuse: func(action, id string) *nodeapi.Error {
		return &nodeapi.Error{Status: 500, Code: nodeapi.CodeInternal, Message: long}
	}}
	e, s := sessionOnStub(t, stub)
	msg := expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, nil), 502, "snapshot_failed", "")
	var snaps struct {
		Data []session.Snapshot `json:"data"`
	}
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &snaps)
	if len(snaps.Data) != 1 || snaps.Data[0].State != session.SnapshotFailed {
		t.Fatalf("the snapshots after the failed one: %d, want one failed", len(snaps.Data))
	}
	r := snaps.Data[0].FailureReason
	const most = 1 << 10 // maxRelayedMessage
	if len(r) > most || len(r) < most/2 || !utf8.ValidString(r) || !strings.HasPrefix(r, "the node could not take the snapshot") || !strings.HasSuffix(r, "…") {
		t.Errorf("a node's error of %d bytes left a failure_reason of %d bytes (valid UTF-8: %v), starting %.80q; want at most %d, whole runes, ending …",
			len(long), len(r), utf8.ValidString(r), r, most)
	}
	// The request was answered the same, cut.
	if msg != r {
		t.Errorf("the snapshot's 502 said %d bytes, starting %.80q; want its failure_reason's %d", len(msg), msg, len(r))
	}
}

// sessionOnStub answers an env whose gateway calls nodes through the node client, and a
// running tier-2 session of it whose node is stub: the fake node places and starts it, and
// its registration then points the client at the stub.
func sessionOnStub(t *testing.T, stub *stubNode) (*env, session.Session) {
	t.Helper()
	srv := httptest.NewServer(stub)
	t.Cleanup(srv.Close)
	e := newEnv(t, func(c *Config) { c.Guests = client.New(c.Store, "node-token") })
	s := e.running(map[string]any{"tier": 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Not the field itself: the env's heartbeat, every second, could write the old address
	// after this one (a loaded run's PATCH went to "127.0.0.1:0").
	if err := e.node.SetAddr(ctx, srv.URL); err != nil {
		t.Fatal(err)
	}
	return e, s
}
