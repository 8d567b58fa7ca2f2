package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"wb/agent"
	"wb/internal/fakenode"
	"wb/node/nodeapi"
	"wb/session"
	"wb/store"
)

// policyNode is a fake node whose agent proxy refuses every PTY, as a node does when the
// session's runtime policy kills or refuses the PTY's command.
type policyNode struct {
	*fakenode.Node
	refusing *httptest.Server
}

func (n policyNode) Agent(context.Context, *session.Session) (*agent.Client, error) {
	return agent.NewHTTPClient(http.DefaultClient, n.refusing.URL, ""), nil
}

// TestPTYRefusedByPolicy: a PTY whose command the runtime policy refuses answers 403
// policy_violation with the node's reason, not a 502 about a failed agent.
func TestPTYRefusedByPolicy(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"error":{"code":"policy_violation","message":"forbidden by policy rule crypto_miner; the session is stopped (policy_violation)"}}`))
	}))
	defer refusing.Close()
	e := newEnv(t, func(c *Config) {
		c.Guests = policyNode{Node: c.Guests.(*fakenode.Node), refusing: refusing}
	})
	s := e.running(map[string]any{"tier": 2})
	u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + s.ID + "/pty?command=xmrig"
	_, resp, err := websocket.Dial(context.Background(), u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.key}}})
	if err == nil || resp == nil {
		t.Fatalf("the PTY opened: %v", err)
	}
	defer resp.Body.Close()
	var body [2048]byte
	n, _ := resp.Body.Read(body[:])
	got := string(body[:n])
	if resp.StatusCode != 403 || !strings.Contains(got, `"policy_violation"`) || !strings.Contains(got, "crypto_miner") {
		t.Fatalf("refused PTY: HTTP %d %s; want 403 policy_violation naming the rule", resp.StatusCode, got)
	}
}

// dyingNode is a fake node whose guest dies of OOM under every exec: the node records the
// end in Redis, and the exec's answer breaks off.
type dyingNode struct {
	*fakenode.Node
	st *store.Store
}

func (n dyingNode) Exec(ctx context.Context, s *session.Session, _ session.ExecRequest, _ []string, _ func(session.ExecChunk) error) (session.ExecResult, error) {
	go func() {
		time.Sleep(300 * time.Millisecond) // the node notices a little after the answer broke
		_, _ = n.st.Transition(context.Background(), store.Change{Project: s.ProjectID, ID: s.ID,
			From: session.Running, To: session.Failed, Driver: session.Node, Reason: session.OOM})
	}()
	return session.ExecResult{}, errors.New("agent: exec: the answer ended without a result: unexpected EOF")
}

// TestExecGuestDiedUnderIt: an exec whose guest died under it answers 409 naming the state
// and reason the node recorded, not a 502 about a broken answer.
func TestExecGuestDiedUnderIt(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Guests = dyingNode{Node: c.Guests.(*fakenode.Node), st: c.Store}
	})
	s := e.running(map[string]any{"tier": 2})
	r := e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "python3 -c 'b=[]\nwhile True: b.append(bytearray(1<<20))'"})
	msg := expectError(t, r, 409, "invalid_state", "*")
	if !strings.Contains(msg, "failed") || !strings.Contains(msg, "oom") {
		t.Fatalf("message %q: want it to name the state and the reason", msg)
	}
}

// namingNode is a fake node that names its guest's end in the broken exec's answer, as
// Node.Exec does once its watcher saw the guest die, and records the end in Redis after.
type namingNode struct{ dyingNode }

func (n namingNode) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, argv []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	_, _ = n.dyingNode.Exec(ctx, s, req, argv, out)
	return session.ExecResult{}, &nodeapi.Error{Status: 409, Code: nodeapi.CodeInvalidState,
		Message: "node: session " + s.ID + " is failed here; its guest ended during the exec (reason oom): unexpected EOF"}
}

// TestExecGuestEndNamedByTheNode: the node's refusal of a broken exec is the answer, at once:
// the gateway does not wait for Redis to record the end (a loaded host's record came more
// than the gateway's three seconds later, and the exec answered 502).
func TestExecGuestEndNamedByTheNode(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Guests = namingNode{dyingNode{Node: c.Guests.(*fakenode.Node), st: c.Store}}
	})
	s := e.running(map[string]any{"tier": 2})
	r := e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"})
	msg := expectError(t, r, 409, "invalid_state", "*")
	if !strings.Contains(msg, "its guest ended during the exec (reason oom)") {
		t.Fatalf("message %q: want the node's, not one read from Redis after a wait", msg)
	}
}

// silentAgentNode is a fake node whose agent takes every request and never answers it, as a
// hostile guest's agent may: it closes gone once the gateway's request to it ended.
type silentAgentNode struct {
	*fakenode.Node
	silent *httptest.Server
}

func (n silentAgentNode) Agent(context.Context, *session.Session) (*agent.Client, error) {
	return agent.NewHTTPClient(http.DefaultClient, n.silent.URL, ""), nil
}

// TestPTYHandshakeEndsWithTheCaller: a PTY whose agent never answers its handshake is let go
// of once its caller goes: the gateway's request to the agent does not outlive the caller's
// (it lasted as long as the gateway did, and every such PTY kept a goroutine and a connection
// on the gateway and on the node for good).
func TestPTYHandshakeEndsWithTheCaller(t *testing.T) {
	gone := make(chan struct{}, 1)
	release := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			gone <- struct{}{}
		case <-release:
		}
	}))
	defer silent.Close()
	defer close(release) // before Close, which waits for the handler
	e := newEnv(t, func(c *Config) {
		c.Guests = silentAgentNode{Node: c.Guests.(*fakenode.Node), silent: silent}
	})
	s := e.running(map[string]any{"tier": 2})
	u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + s.ID + "/pty"
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.key}}}); err == nil {
		conn.CloseNow()
		t.Fatal("the PTY of a silent agent opened")
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway's request to the agent outlived its caller's by 10 s")
	}
}

// deafAgentNode is a fake node whose agent opens every PTY and then reads nothing of it, as
// a hostile guest's agent may.
type deafAgentNode struct {
	*fakenode.Node
	deaf *httptest.Server
}

func (n deafAgentNode) Agent(context.Context, *session.Session) (*agent.Client, error) {
	return agent.NewHTTPClient(http.DefaultClient, n.deaf.URL, ""), nil
}

// ptyHandlers counts the goroutines in the gateway's PTY handler.
func ptyHandlers() int {
	buf := make([]byte, 16<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "gateway.(*Server).pty(")
}

// TestPTYInputTheGuestDoesNotTake: a PTY whose agent takes no input ends once its caller is
// gone and a frame waited ptyInputWait to go to the guest: the handler's copy to the agent
// was blocked for good, and with it the whole PTY, which no longer noticed its caller leave
// (a goroutine, buffers and two connections held for as long as the gateway ran).
func TestPTYInputTheGuestDoesNotTake(t *testing.T) {
	release := make(chan struct{})
	deaf := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		<-release
	}))
	defer deaf.Close()
	defer close(release) // before Close, which waits for the handler
	e := newEnv(t, func(c *Config) {
		c.Guests = deafAgentNode{Node: c.Guests.(*fakenode.Node), deaf: deaf}
	})
	e.gw.ptyInputWait = time.Second
	s := e.running(map[string]any{"tier": 2})
	u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + s.ID + "/pty"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.key}}})
	if err != nil {
		t.Fatalf("PTY: %v", err)
	}
	// Write until the frames go no further (every buffer on the way full), then leave.
	frame := make([]byte, 64<<10)
	wrote := 0
	for ; wrote < 256<<20; wrote += len(frame) {
		wctx, wcancel := context.WithTimeout(ctx, time.Second)
		err := conn.Write(wctx, websocket.MessageBinary, frame)
		wcancel()
		if err != nil {
			break
		}
	}
	conn.CloseNow()
	if wrote >= 256<<20 {
		t.Fatal("256 MiB went to an agent that reads nothing")
	}
	deadline := time.Now().Add(e.gw.ptyInputWait + 10*time.Second)
	for ptyHandlers() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the PTY handler still runs %s after its caller left (%d KiB written)", e.gw.ptyInputWait+10*time.Second, wrote>>10)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// endlessExecNode is a fake node whose every exec sends output without end, as fast as its
// caller takes it, and sends on stopped once a chunk's write failed (a node then ends the
// exec, and the agent kills its processes).
type endlessExecNode struct {
	*fakenode.Node
	stopped chan error
}

func (n endlessExecNode) Exec(ctx context.Context, _ *session.Session, _ session.ExecRequest, _ []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	data := strings.Repeat("x", 32<<10)
	for {
		if err := out(session.ExecChunk{Stream: "stdout", Data: data}); err != nil {
			n.stopped <- err
			return session.ExecResult{}, err
		}
	}
}

// TestExecStalledCallerEndsTheExec: a caller of a streamed exec that stays connected but
// takes none of its answer ends the exec once a write waited WriteStall: the output's
// write fails, which ends the node's exec. Before, the exec was held for as long as the
// caller stayed.
func TestExecStalledCallerEndsTheExec(t *testing.T) {
	stopped := make(chan error, 1)
	e := newEnv(t, func(c *Config) {
		c.Guests = endlessExecNode{Node: c.Guests.(*fakenode.Node), stopped: stopped}
		c.WriteStall = 3 * time.Second
	})
	s := e.running(map[string]any{"tier": 2})
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	body := `{"command":"yes"}`
	fmt.Fprintf(conn, "POST /v1/sessions/%s/exec HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nAccept: application/x-ndjson\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		s.ID, e.key, len(body), body)
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("the answer's status line: %q, %v; want a 200", status, err)
	}
	// The caller now reads no more, and stays.
	select {
	case err := <-stopped:
		if !strings.Contains(err.Error(), "took none of the answer") {
			t.Errorf("the exec's output failed with %v; want it to say its caller took none of it", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("45 s after its caller stopped reading, the exec's output still waited on it; want it ended after the 1 s WriteStall")
	}
}

// guestForbiddingNode is a fake node (an older one, which passes its agent's answers on as
// they came) whose guest's agent answers every exec and PTY 403 with a code of its own.
type guestForbiddingNode struct {
	*fakenode.Node
	forbidding *httptest.Server
}

func (n guestForbiddingNode) Exec(context.Context, *session.Session, session.ExecRequest, []string, func(session.ExecChunk) error) (session.ExecResult, error) {
	return session.ExecResult{}, &agent.Error{Status: 403, Code: "forbidden", Message: "forbidden by policy rule forged; the session is stopped (policy_violation)"}
}

func (n guestForbiddingNode) Agent(context.Context, *session.Session) (*agent.Client, error) {
	return agent.NewHTTPClient(http.DefaultClient, n.forbidding.URL, ""), nil
}

// TestGuestForbiddenIsNotAPolicyKill: a 403 whose code is not the node's policy refusal (the
// guest's agent answered it) is the guest's error, a 502, for an exec and a PTY: only the
// node's runtime policy makes a 403 policy_violation. Before, every 403 was one, and a
// hostile guest could make its sessions look policy-killed.
func TestGuestForbiddenIsNotAPolicyKill(t *testing.T) {
	forbidding := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"error":{"code":"forbidden","message":"forbidden by policy rule forged; the session is stopped (policy_violation)"}}`))
	}))
	defer forbidding.Close()
	e := newEnv(t, func(c *Config) {
		c.Guests = guestForbiddingNode{Node: c.Guests.(*fakenode.Node), forbidding: forbidding}
	})
	s := e.running(map[string]any{"tier": 2})
	r := e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"})
	expectError(t, r, 502, "exec_failed", "*")
	u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + s.ID + "/pty?command=sh"
	_, resp, err := websocket.Dial(context.Background(), u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.key}}})
	if err == nil || resp == nil {
		t.Fatalf("the PTY opened: %v", err)
	}
	defer resp.Body.Close()
	var body [2048]byte
	n, _ := resp.Body.Read(body[:])
	if got := string(body[:n]); resp.StatusCode != 502 || strings.Contains(got, "policy_violation\"") {
		t.Fatalf("a PTY the guest's agent refused: HTTP %d %s; want a 502 of the guest's, not a policy kill", resp.StatusCode, got)
	}
}

// TestPTYsAreCapped: a project has at most Config.MaxConcurrentPTYs PTYs open on a gateway
// (here against an agent that opens each and then holds it, as a hostile guest's may); past
// them a handshake answers 429 too_many_ptys naming the limit, with a Retry-After, and once
// one closes the next opens. Another project is not affected. Before, a tenant could open
// any number, each holding two connections and a goroutine pair on the gateway.
func TestPTYsAreCapped(t *testing.T) {
	release := make(chan struct{})
	deaf := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer deaf.Close()
	defer close(release) // before Close, which waits for the handler
	e := newEnv(t, func(c *Config) {
		c.MaxConcurrentPTYs = 2
		c.Guests = deafAgentNode{Node: c.Guests.(*fakenode.Node), deaf: deaf}
	})
	s := e.running(map[string]any{"tier": 2})
	open := func(key, id string) (*websocket.Conn, *http.Response, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + id + "/pty"
		return websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	}
	var conns []*websocket.Conn
	defer func() {
		for _, c := range conns {
			c.CloseNow()
		}
	}()
	for i := range 2 {
		c, _, err := open(e.key, s.ID)
		if err != nil {
			t.Fatalf("PTY %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	c, resp, err := open(e.key, s.ID)
	if err == nil {
		c.CloseNow()
		t.Fatal("a third PTY opened with a cap of 2")
	}
	var body []byte
	if resp != nil {
		body, _ = io.ReadAll(resp.Body)
	}
	if resp == nil || resp.StatusCode != 429 || !strings.Contains(string(body), `"too_many_ptys"`) ||
		!strings.Contains(string(body), "2 PTYs in progress") || resp.Header.Get("Retry-After") == "" {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("a third PTY with 2 open: %v, %d %s; want a 429 too_many_ptys naming the limit of 2, with a Retry-After", err, status, body)
	}
	// Another project has its own PTYs.
	_, keyB := e.newProject("B", nil)
	sB := e.waitState(keyB, e.create(keyB, map[string]any{"tier": 2}).ID, session.Running)
	cB, _, err := open(keyB, sB.ID)
	if err != nil {
		t.Fatalf("another project's PTY: %v", err)
	}
	cB.CloseNow()
	// Once one closes, the next opens.
	conns[0].CloseNow()
	conns = conns[1:]
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		c, _, err := open(e.key, s.ID)
		if err == nil {
			conns = append(conns, c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no PTY opened a minute after one of 2 closed: %v", err)
		}
	}
}

// undecidedNode is a fake node whose session's runtime policy cannot decide: it refuses
// every exec and PTY 403 policy_error, as the node's runtimeRefusal does.
type undecidedNode struct {
	*fakenode.Node
	refusing *httptest.Server
}

const undecided = "refused: the session's runtime policy could not decide (eval_conflict_error in rule deny); fix or re-pin the policy, or retry"

func (n undecidedNode) Exec(context.Context, *session.Session, session.ExecRequest, []string, func(session.ExecChunk) error) (session.ExecResult, error) {
	return session.ExecResult{}, &agent.Error{Status: 403, Code: nodeapi.CodePolicyError, Message: undecided}
}

func (n undecidedNode) Agent(context.Context, *session.Session) (*agent.Client, error) {
	return agent.NewHTTPClient(http.DefaultClient, n.refusing.URL, ""), nil
}

// TestPolicyErrorIsNotAKill: a command the session's runtime policy could not decide on (the
// node's 403 policy_error) answers 403 policy_error, saying the policy could not decide and
// what to check, for an exec (plain and streamed) and a PTY: a caller tells it from a kill.
// Before, the gateway answered both policy_violation.
func TestPolicyErrorIsNotAKill(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"error":{"code":"policy_error","message":"` + undecided + `"}}`))
	}))
	defer refusing.Close()
	e := newEnv(t, func(c *Config) {
		c.Guests = undecidedNode{Node: c.Guests.(*fakenode.Node), refusing: refusing}
	})
	s := e.running(map[string]any{"tier": 2})
	wantMsg := func(what, msg string) {
		t.Helper()
		if !strings.Contains(msg, "could not decide") || !strings.Contains(msg, "eval_conflict_error") || !strings.Contains(msg, "decision log") {
			t.Errorf("%s: message %q; want it to say the policy could not decide, why, and to see the decision log", what, msg)
		}
	}
	msg := expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"}), 403, "policy_error", "*")
	wantMsg("exec", msg)
	msg = expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"}, "Accept", "application/x-ndjson"), 403, "policy_error", "*")
	wantMsg("streamed exec", msg)
	u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + s.ID + "/pty?command=sh"
	_, resp, err := websocket.Dial(context.Background(), u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.key}}})
	if err == nil || resp == nil {
		t.Fatalf("the PTY opened: %v", err)
	}
	defer resp.Body.Close()
	var body [2048]byte
	n, _ := resp.Body.Read(body[:])
	got := string(body[:n])
	if resp.StatusCode != 403 || !strings.Contains(got, `"policy_error"`) {
		t.Fatalf("a PTY the policy could not decide on: HTTP %d %s; want 403 policy_error", resp.StatusCode, got)
	}
	wantMsg("PTY", got)
	// The session goes on: the command failed closed, nothing killed it.
	if r := e.mustDo("GET", "/v1/sessions/"+s.ID, e.key, nil, 200, nil); !strings.Contains(string(r.body), `"running"`) {
		t.Errorf("the session after a refusal: %s; want it running", r.body)
	}
}

// runningWith answers whether a process whose command line holds marker runs on this host (the
// fake node's agents run their commands here).
func runningWith(marker string) bool {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline")); err == nil && strings.Contains(string(b), marker) {
			return true
		}
	}
	return false
}

// TestPTYOutputStalledCallerEndsThePTY: a PTY whose caller stays connected but takes none of
// its output ends once a frame to it waited WriteStall: the gateway closes the guest's side,
// so that the agent kills the terminal's program as when its caller leaves, and lets go of
// the project's PTY slot. Before, the copy to the caller blocked for good, and the PTY, its
// slot and the guest's agent connection were held for as long as the caller stayed.
func TestPTYOutputStalledCallerEndsThePTY(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MaxConcurrentPTYs = 1
		c.WriteStall = 3 * time.Second
	})
	s := e.running(map[string]any{"tier": 2})
	marker := fmt.Sprintf("stalled-pty-%d", time.Now().UnixNano())
	u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + s.ID + "/pty?command=" + url.QueryEscape("yes "+marker)
	open := func() (*websocket.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.key}}})
		return conn, err
	}
	conn, err := open()
	if err != nil {
		t.Fatalf("PTY: %v", err)
	}
	defer conn.CloseNow()
	// The caller reads nothing, and stays, while the guest prints without end.
	for deadline := time.Now().Add(30 * time.Second); !runningWith(marker); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the PTY's command never ran")
		}
	}
	deadline := time.Now().Add(45 * time.Second)
	for ptyHandlers() > 0 || runningWith(marker) {
		if time.Now().After(deadline) {
			t.Fatalf("45 s after its caller stopped reading, the PTY still ran (handler: %v, command: %v); want it ended after the 3 s stall, its command killed",
				ptyHandlers() > 0, runningWith(marker))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Its slot is free: the next PTY opens.
	next, err := open()
	if err != nil {
		t.Fatalf("a PTY after the stalled one ended: %v", err)
	}
	next.CloseNow()
}

// onceUndecidedNode refuses its first exec 403 policy_error (the runtime decision point did
// not answer), and runs the others.
type onceUndecidedNode struct {
	*fakenode.Node
	calls *atomic.Int64
}

func (n onceUndecidedNode) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, argv []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	if n.calls.Add(1) == 1 {
		return session.ExecResult{}, &agent.Error{Status: 403, Code: nodeapi.CodePolicyError,
			Message: "refused: the session's runtime policy could not decide (the runtime decision point did not answer); fix or re-pin the policy, or retry"}
	}
	return n.Node.Exec(ctx, s, req, argv, out)
}

// TestPolicyErrorIsNotKeptForReplays: a command refused because the policy could not decide
// (nothing ran; the session goes on) is not kept for its Idempotency-Key's replays, as a 429
// is not: its retry with the same key is decided again, and runs. Before, the retry replayed
// the 403 and never reached the node.
func TestPolicyErrorIsNotKeptForReplays(t *testing.T) {
	calls := &atomic.Int64{}
	e := newEnv(t, func(c *Config) {
		c.Guests = onceUndecidedNode{Node: c.Guests.(*fakenode.Node), calls: calls}
	})
	s := e.running(map[string]any{"tier": 2})
	req := map[string]any{"command": "echo hi"}
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, req, "Idempotency-Key", "k-undecided"), 403, "policy_error", "*")
	r := e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, req, "Idempotency-Key", "k-undecided")
	if r.status != 200 || calls.Load() != 2 {
		t.Fatalf("the retry with its Idempotency-Key of a command the policy could not decide on: %d %s (the node asked %d times); want it decided again and run",
			r.status, strings.TrimSpace(string(r.body)), calls.Load())
	}
	// A replay of the run is the run's: the node is not asked a third time.
	if r := e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, req, "Idempotency-Key", "k-undecided"); r.status != 200 || calls.Load() != 2 {
		t.Fatalf("a replay after the run: %d (the node asked %d times); want the run's 200, not run again", r.status, calls.Load())
	}
}
