package gateway

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"wb/agent"
	"wb/desktop"
	"wb/desktop/guest"
	"wb/internal/fakenode"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// mcpKey adds an API key to every request of an MCP client.
type mcpKey struct{ key string }

func (b mcpKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpConnect connects the official SDK's client to a desktop's mcp_url with key.
func mcpConnect(ctx context.Context, url, key string, opts *mcp.ClientOptions, sessOpts *mcp.ClientSessionOptions) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "wb-test", Version: "1"}, opts)
	return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: mcpKey{key}}, MaxRetries: -1}, sessOpts)
}

func (e *env) mcpSession(d desktop.Desktop) *mcp.ClientSession {
	e.t.Helper()
	cs, err := mcpConnect(context.Background(), d.MCPURL, e.key, nil, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// callTool calls a tool and fails the test on a JSON-RPC error or a tool error.
func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %s", name, textOf(res))
	}
	return res
}

func textOf(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// rpcError calls a tool that must be refused and answers the JSON-RPC error.
func rpcError(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *jsonrpc.Error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		t.Fatalf("%s: want a JSON-RPC error, got %v (result %+v)", name, err, res)
	}
	return we
}

// TestDesktopMCPWakesOnToolCall: initialize and tools/list leave an asleep desktop asleep;
// a tool call wakes it, waits, and answers; every tool works on the running desktop.
func TestDesktopMCPWakesOnToolCall(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "agent's"})
	e.desktopAction(d.ID, "sleep", 202)
	d = e.waitDesktop(d.ID, desktop.Asleep)

	cs := e.mcpSession(d)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	if want := []string{"list_files", "read_file", "run_command", "run_js", "screenshot", "write_file"}; !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	if got := e.desktop(d.ID); got.State != desktop.Asleep || !got.LastUsedAt.Equal(d.LastUsedAt.Time) {
		t.Fatalf("after the handshake and tools/list: %s, last used %v (was %v)", got.State, got.LastUsedAt, d.LastUsedAt)
	}

	res := callTool(t, cs, "run_command", map[string]any{"command": "echo woke; echo oops >&2; exit 3"})
	var out session.ExecResult
	if err := json.Unmarshal([]byte(textOf(res)), &out); err != nil {
		t.Fatalf("run_command answered %q: %v", textOf(res), err)
	}
	if out.Stdout != "woke\n" || out.Stderr != "oops\n" || out.ExitCode != 3 {
		t.Fatalf("run_command: %+v", out)
	}
	woke := e.desktop(d.ID)
	if woke.State != desktop.Running || woke.SessionID == "" {
		t.Fatalf("after a tool call the desktop is %s", woke.State)
	}
	if s := e.sessionOf(woke.SessionID); s.RestoreFrom == nil {
		t.Errorf("woke fresh, not from its saved state: %+v", s)
	}

	// The other tools, on the running desktop.
	res = callTool(t, cs, "run_command", map[string]any{"argv": []string{"printf", "%s|", "a b", "c"}})
	if !strings.Contains(textOf(res), `"stdout":"a b|c|"`) {
		t.Errorf("run_command argv: %s", textOf(res))
	}
	callTool(t, cs, "write_file", map[string]any{"path": "notes/a.txt", "content": "hello"})
	callTool(t, cs, "write_file", map[string]any{"path": "notes/b.bin", "content": "AP8=", "encoding": "base64"})
	res = callTool(t, cs, "read_file", map[string]any{"path": "notes/a.txt"})
	if got := res.StructuredContent; !strings.Contains(textOf(res), `"content":"hello"`) || !strings.Contains(textOf(res), `"encoding":"utf-8"`) {
		t.Errorf("read_file: %s (%v)", textOf(res), got)
	}
	res = callTool(t, cs, "read_file", map[string]any{"path": "notes/b.bin"})
	if !strings.Contains(textOf(res), `"content":"AP8="`) || !strings.Contains(textOf(res), `"encoding":"base64"`) {
		t.Errorf("read_file of bytes: %s", textOf(res))
	}
	res = callTool(t, cs, "list_files", map[string]any{"path": "notes"})
	if !strings.Contains(textOf(res), `"name":"a.txt"`) || !strings.Contains(textOf(res), `"name":"b.bin"`) {
		t.Errorf("list_files: %s", textOf(res))
	}
	// A tool that ran and failed is a tool error, not a JSON-RPC error.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "notes/none"}})
	if err != nil || !res.IsError {
		t.Errorf("read_file of no file: %v, %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{}})
	if err != nil || !res.IsError || !strings.Contains(textOf(res), "command or argv") {
		t.Errorf("run_command without a command: %v, %+v", err, res)
	}
}

// TestDesktopMCPRefusals: a tool call to a stopped desktop is a 409 JSON-RPC error naming
// the state and what to do, to a failed one a 502 with its message, with no machine with
// room a 409 (and it stays asleep); another project's key is a 404, a bad key a 401.
func TestDesktopMCPRefusals(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "refused"})
	e.desktopAction(d.ID, "stop", 202)
	d = e.waitDesktop(d.ID, desktop.Stopped)
	cs := e.mcpSession(d)
	we := rpcError(t, cs, "run_command", map[string]any{"command": "true"})
	if we.Code != 409 || !strings.Contains(we.Message, "stopped") || !strings.Contains(we.Message, ":start") {
		t.Errorf("stopped: %d %q", we.Code, we.Message)
	}
	var data struct {
		Status int    `json:"status"`
		Type   string `json:"type"`
		Code   string `json:"code"`
	}
	if err := json.Unmarshal(we.Data, &data); err != nil || data.Status != 409 || data.Code != "invalid_state" {
		t.Errorf("stopped: data %s", we.Data)
	}
	if got := e.desktop(d.ID); got.State != desktop.Stopped {
		t.Errorf("a refused call moved the desktop to %s", got.State)
	}

	// No machine with room: 409 no_capacity, and the desktop stays asleep.
	e.desktopAction(d.ID, "start", 202)
	e.waitDesktop(d.ID, desktop.Running)
	e.desktopAction(d.ID, "sleep", 202)
	e.waitDesktop(d.ID, desktop.Asleep)
	if err := e.node.SetCapacity(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	we = rpcError(t, cs, "screenshot", nil)
	if we.Code != 409 || !strings.Contains(we.Message, "no_capacity") {
		t.Errorf("no room: %d %q", we.Code, we.Message)
	}
	if got := e.desktop(d.ID); got.State != desktop.Asleep {
		t.Errorf("no room, yet the desktop is %s", got.State)
	}
	if err := e.node.SetCapacity(context.Background(), 1000); err != nil {
		t.Fatal(err)
	}

	// A desktop that could not start.
	e.node.SetStarts(true, false)
	var f desktop.Desktop
	e.mustDo("POST", "/v1/desktops", e.key, map[string]any{"name": "fails"}, 201, &f)
	f = e.waitDesktop(f.ID, desktop.Failed)
	we = rpcError(t, e.mcpSession(f), "list_files", map[string]any{"path": "."})
	if we.Code != 502 || !strings.Contains(we.Message, "failed") || !strings.Contains(we.Message, f.Message) {
		t.Errorf("failed: %d %q (message %q)", we.Code, we.Message, f.Message)
	}

	// Keys: another project's desktop is not found; a bad key is unauthenticated.
	_, keyB := e.newProject("B", nil)
	ctx := context.Background()
	if _, err := mcpConnect(ctx, d.MCPURL, keyB, nil, nil); err == nil || !strings.Contains(err.Error(), "Not Found") {
		t.Errorf("another project's key: %v", err)
	}
	if _, err := mcpConnect(ctx, d.MCPURL, "wb_bad", nil, nil); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("a bad key: %v", err)
	}
	if _, err := mcpConnect(ctx, e.url+"/v1/desktops/desk_none/mcp", e.key, nil, nil); err == nil || !strings.Contains(err.Error(), "Not Found") {
		t.Errorf("no such desktop: %v", err)
	}
}

// badToolCall is a tool call whose arguments are wrong, and a part of the tool error it
// answers.
type badToolCall struct {
	tool string
	args map[string]any
	want string
}

// brief is the call's arguments for a test's message, cut short past 120 bytes.
func (bc badToolCall) brief() string {
	b, _ := json.Marshal(bc.args)
	if len(b) > 120 {
		return string(b[:120]) + "…"
	}
	return string(b)
}

// badToolCalls are calls of every tool but screenshot (which takes no arguments) that its
// own checks refuse, with no round trip to the desktop needed to tell.
func badToolCalls() []badToolCall {
	big := strings.Repeat("x", MCPMaxFileBytes+1)
	return []badToolCall{
		{"run_command", map[string]any{}, "command or argv is required"},
		{"run_command", map[string]any{"command": "true", "argv": []string{"true"}}, "give command or argv, not both"},
		{"run_command", map[string]any{"command": "true", "timeout_s": 7200}, "timeout_s: must be 1–3600 seconds"},
		{"run_command", map[string]any{"argv": []string{""}}, "command: must be a non-empty string or an array of strings"},
		{"run_command", map[string]any{"command": "cat", "stdin": strings.Repeat("x", session.MaxStdinBytes+1)}, "stdin: at most"},
		{"read_file", map[string]any{"path": ""}, "path is required"},
		{"read_file", map[string]any{"path": "a\x00b"}, "path: not a usable path"},
		{"list_files", map[string]any{"path": ""}, "path is required"},
		{"write_file", map[string]any{"path": "", "content": "x"}, "path is required"},
		{"write_file", map[string]any{"path": "a.txt", "content": "x", "encoding": "latin1"}, `encoding: "latin1" is neither utf-8 nor base64`},
		{"write_file", map[string]any{"path": "a.txt", "content": "!!", "encoding": "base64"}, "content: not base64"},
		{"write_file", map[string]any{"path": "a.txt", "content": big}, "write_file takes at most 8 MiB"},
		{"run_js", map[string]any{"script": "1", "timeout_ms": -1}, "timeout_ms must be 1 to 30000"},
		{"run_js", map[string]any{"script": "1", "timeout_ms": 30001}, "timeout_ms must be 1 to 30000"},
		{"run_js", map[string]any{"script": " "}, "run_js: script is empty"},
		{"run_js", map[string]any{"script": big[:guest.MaxScriptBytes+1]}, "run_js: script is"},
	}
}

// toolError calls a tool that must answer a tool error (isError) and answers its text.
func toolError(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil || !res.IsError {
		t.Errorf("%s: want a tool error, got %v, %s", name, err, describeResult(res))
		return ""
	}
	return textOf(res)
}

// TestDesktopMCPBadArgumentsLeaveItAsleep: a tool call to an asleep desktop whose arguments
// its tool refuses answers that tool error and leaves the desktop asleep: no wake, no new
// session, no use recorded. Before, the call woke the desktop (a guest started and billed)
// only to be refused.
func TestDesktopMCPBadArgumentsLeaveItAsleep(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "asleep"})
	e.desktopAction(d.ID, "sleep", 202)
	d = e.waitDesktop(d.ID, desktop.Asleep)
	sessions := func() []string {
		t.Helper()
		page, err := e.st.List(context.Background(), e.projA, store.ListQuery{Limit: store.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range page.Sessions {
			ids = append(ids, s.ID)
		}
		slices.Sort(ids)
		return ids
	}
	before := sessions()
	cs := e.mcpSession(d)
	for _, bc := range badToolCalls() {
		if msg := toolError(t, cs, bc.tool, bc.args); !strings.Contains(msg, bc.want) {
			t.Errorf("%s %s: %q, want the argument's error %q", bc.tool, bc.brief(), msg, bc.want)
		}
		if got := e.desktop(d.ID); got.State != desktop.Asleep || got.SessionID != d.SessionID || !got.LastUsedAt.Equal(d.LastUsedAt.Time) {
			t.Fatalf("after %s %s the desktop is %s on session %s, last used %v (was asleep, %s, %v)",
				bc.tool, bc.brief(), got.State, got.SessionID, got.LastUsedAt, d.SessionID, d.LastUsedAt)
		}
	}
	if after := sessions(); !slices.Equal(after, before) {
		t.Errorf("the project's sessions went from %v to %v", before, after)
	}
}

// TestDesktopMCPBadArgumentsBeforeTheCap: with the project's exec and file calls at their
// caps, a tool call whose arguments its tool refuses answers that error, not the cap's (a
// retry once a slot is free would be refused again); a good call answers the cap's.
// Before, the slot was taken first and the call answered the cap's error.
func TestDesktopMCPBadArgumentsBeforeTheCap(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxConcurrentExecs, c.MaxConcurrentFileCalls = 1, 1 })
	d := e.newDesktop(map[string]any{"name": "busy"})
	cs := e.mcpSession(d)
	// The project's one exec and one file call are taken, as a call in progress holds them.
	if !e.gw.execs.take(e.projA, 1, 1) || !e.gw.fileCalls.take(e.projA, 1, 1) {
		t.Fatal("the project's slots are taken already")
	}
	t.Cleanup(func() { e.gw.execs.give(e.projA, 1); e.gw.fileCalls.give(e.projA, 1) })
	if msg := toolError(t, cs, "run_command", map[string]any{"command": "true"}); !strings.Contains(msg, "1 execs in progress") {
		t.Errorf("a good run_command with the cap full: %q, want the cap's error", msg)
	}
	if msg := toolError(t, cs, "read_file", map[string]any{"path": "a.txt"}); !strings.Contains(msg, "1 file or screen calls in progress") {
		t.Errorf("a good read_file with the cap full: %q, want the cap's error", msg)
	}
	for _, bc := range badToolCalls() {
		if msg := toolError(t, cs, bc.tool, bc.args); !strings.Contains(msg, bc.want) {
			t.Errorf("%s %s with the cap full: %q, want the argument's error %q", bc.tool, bc.brief(), msg, bc.want)
		}
	}
}

// TestDesktopMCPIdleClient: a connected MCP client that only pings (the 2025-11-25 protocol,
// with keepalives) does not keep the desktop awake; a tool call that runs longer than the
// idle time does, for as long as it runs. The SDK's keepalive gives each ping half its
// period and closes the session at the first miss by default: a loaded cold make test missed
// one, then ten in a row of 125 ms, so a ping a second (two in the idle time), ten misses
// allowed.
func TestDesktopMCPIdleClient(t *testing.T) {
	const idle = 2 * time.Second
	e := newEnv(t, func(c *Config) { c.DesktopIdle = idle })
	d := e.newDesktop(map[string]any{"name": "idle"})
	cs, err := mcpConnect(context.Background(), d.MCPURL, e.key, &mcp.ClientOptions{KeepAlive: idle / 2, KeepAliveFailureThreshold: 10},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	// A call of twice the idle time keeps it awake to its end.
	callPastIdle(t, e, cs, d.ID, idle, "")

	// Then the client stays connected and pings: it sleeps.
	t0 := time.Now()
	e.waitDesktop(d.ID, desktop.Asleep)
	if el := time.Since(t0); el < idle/2 {
		t.Errorf("asleep %v after the call; idle is %v", el, idle)
	}
	if err := cs.Ping(context.Background(), nil); err != nil {
		t.Errorf("the client's connection broke: %v", err)
	}
}

// TestDesktopMCPCallOutlivesASlowNode: a node slow to record a session's activity (its
// guest's lock held, a journal write on a busy disk; here Touch waits four idle times)
// does not let the desktop fall idle during a tool call longer than the idle time: the
// desktop's own uses are recorded without waiting for it.
func TestDesktopMCPCallOutlivesASlowNode(t *testing.T) {
	const idle = 2 * time.Second
	e := newEnv(t, func(c *Config) { c.DesktopIdle = idle })
	d := e.newDesktop(map[string]any{"name": "slow node"})
	cs, err := mcpConnect(context.Background(), d.MCPURL, e.key, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	release := e.node.BlockTouches()
	defer release()
	stop := time.AfterFunc(4*idle, release) // bounded, so that a touch in the call's path ends
	defer stop.Stop()
	callPastIdle(t, e, cs, d.ID, idle, ", with a slow node")
}

// callPastIdle runs a tool call of twice the idle time on desktop id, and fails the test
// unless the call ends well and the desktop still runs after it (how adds to the message).
func callPastIdle(t *testing.T, e *env, cs *mcp.ClientSession, id string, idle time.Duration, how string) {
	t.Helper()
	res := callTool(t, cs, "run_command", map[string]any{"command": fmt.Sprintf("sleep %d; echo done", int(2*idle/time.Second))})
	if !strings.Contains(textOf(res), `"stdout":"done\n"`) {
		t.Fatalf("long call%s: %s", how, textOf(res))
	}
	if got := e.desktop(id); got.State != desktop.Running {
		t.Fatalf("after a call longer than the idle time%s: %s", how, got.State)
	}
}

// TestDesktopFilesUse: a listing or a read of an asleep desktop answers 409 and leaves it
// asleep; a file sent wakes it and is written; deleting one is a use too.
func TestDesktopFilesUse(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "files"})
	files := "/v1/desktops/" + d.ID + "/files?path="
	e.mustDo("PUT", files+"a.txt", e.key, []byte("one"), 204, nil)
	if r := e.do("GET", files+"a.txt", e.key, nil); r.status != 200 || string(r.body) != "one" {
		t.Fatalf("read: %d %s", r.status, r.body)
	}
	e.desktopAction(d.ID, "sleep", 202)
	d = e.waitDesktop(d.ID, desktop.Asleep)

	msg := expectError(t, e.do("GET", files+".&list=1", e.key, nil), 409, "invalid_state", "")
	if !strings.Contains(msg, "asleep") || !strings.Contains(msg, ":wake") {
		t.Errorf("listing an asleep desktop: %s", msg)
	}
	expectError(t, e.do("GET", files+"a.txt", e.key, nil), 409, "invalid_state", "")
	if got := e.desktop(d.ID); got.State != desktop.Asleep {
		t.Fatalf("a listing and a read moved it to %s", got.State)
	}

	e.mustDo("PUT", files+"b.txt", e.key, []byte("two"), 204, nil)
	woke := e.desktop(d.ID)
	if woke.State != desktop.Running || woke.LastUsedAt == nil || !woke.LastUsedAt.After(d.LastUsedAt.Time) {
		t.Fatalf("after a file sent: %+v", woke)
	}
	if r := e.do("GET", files+"b.txt", e.key, nil); r.status != 200 || string(r.body) != "two" {
		t.Fatalf("read after the wake: %d %s", r.status, r.body)
	}
	e.desktopAction(d.ID, "sleep", 202)
	e.waitDesktop(d.ID, desktop.Asleep)
	// (The fake node's guests keep no files across a sleep: write the file to delete again.)
	e.mustDo("DELETE", files+"b.txt", e.key, nil, 404, nil)
	if got := e.desktop(d.ID); got.State != desktop.Running {
		t.Fatalf("after a file deleted: %s", got.State)
	}

	// Stopped: 409 for all, the desktop stays stopped.
	e.desktopAction(d.ID, "stop", 202)
	e.waitDesktop(d.ID, desktop.Stopped)
	msg = expectError(t, e.do("PUT", files+"c.txt", e.key, []byte("x"), "Content-Type", "application/octet-stream"), 409, "invalid_state", "")
	if !strings.Contains(msg, "stopped") || !strings.Contains(msg, ":start") {
		t.Errorf("sending a file to a stopped desktop: %s", msg)
	}
	expectError(t, e.do("GET", "/v1/desktops/desk_none/files?path=a", e.key, nil), 404, "not_found", "")
	expectError(t, e.do("PUT", "/v1/desktops/"+d.ID+"/files", e.key, []byte("x")), 400, "invalid_request", "path")
}

// TestMCPCallError: the JSON-RPC error of a refused call carries the API's status as its
// code, the status and code in its message, and the API's error object as its data.
func TestMCPCallError(t *testing.T) {
	for _, tc := range []struct {
		err     error
		code    int64
		message string
	}{
		{errState("desktop is stopped: start it"), 409, "409 invalid_state: desktop is stopped: start it"},
		{errDesktopFailed(desktop.Record{Desktop: desktop.Desktop{ID: "desk_1", Message: "no display"}}), 502,
			"502 desktop_failed: desktop is failed: no display; start it again (POST /v1/desktops/desk_1:start) or delete it"},
		{errNotFound("desktop", "desk_2"), 404, `404 not_found: no desktop "desk_2" in this project`},
		{errors.New("redis: connection refused 10.0.0.1:6379"), 500, "500 internal: internal error; it has been logged"},
	} {
		we := mcpCallError(tc.err)
		if we.Code != tc.code || we.Message != tc.message {
			t.Errorf("%v: %d %q, want %d %q", tc.err, we.Code, we.Message, tc.code, tc.message)
		}
		var data map[string]any
		if err := json.Unmarshal(we.Data, &data); err != nil || data["status"] != float64(tc.code) || data["message"] == "" || data["type"] == "" {
			t.Errorf("%v: data %s", tc.err, we.Data)
		}
		if strings.Contains(string(we.Data), "10.0.0.1") {
			t.Errorf("an internal error leaked: %s", we.Data)
		}
	}
}

// TestDesktopReadyStates: what a call finds in each state, by cause.
func TestDesktopReadyStates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, err := e.st.GetProject(ctx, e.projA)
	if err != nil {
		t.Fatal(err)
	}
	rec := func(st, goal desktop.State) desktop.Record {
		return desktop.Record{Desktop: desktop.Desktop{ID: "desk_x", State: st, Message: "why"}, Goal: goal}
	}
	for _, tc := range []struct {
		rec    desktop.Record
		cause  desktop.Cause
		status int // 0: wait
	}{
		{rec(desktop.Starting, ""), desktop.MCP, 0},
		{rec(desktop.Starting, ""), "", 0},
		{rec(desktop.Stopping, desktop.Asleep), desktop.MCP, 0},
		{rec(desktop.Stopping, desktop.Asleep), "", 409},
		{rec(desktop.Stopping, desktop.Stopped), desktop.MCP, 409},
		{rec(desktop.Asleep, ""), "", 409},
		{rec(desktop.Stopped, ""), desktop.File, 409},
		{rec(desktop.Stopped, ""), "", 409},
		{rec(desktop.Failed, ""), desktop.MCP, 502},
		{rec(desktop.Failed, ""), "", 502},
	} {
		sess, err := e.gw.desktopReady(ctx, p, tc.rec, tc.cause)
		status := 0
		if err != nil {
			status = toAPIError(err).Status
		}
		if sess != nil || status != tc.status {
			t.Errorf("%s (to %q) for %q: %v %v, want status %d", tc.rec.State, tc.rec.Goal, tc.cause, sess, err, tc.status)
		}
	}
}

// TestDesktopMCPBehindProxy: a gateway listening on loopback behind a TLS proxy receives the
// public Host; the endpoint serves it (the SDK's DNS-rebinding guard would answer 403), and
// GET, the standalone stream, is 405.
func TestDesktopMCPBehindProxy(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "proxied"})
	post := func(method, body string) *http.Response {
		req, _ := http.NewRequest(method, d.MCPURL, strings.NewReader(body))
		req.Host = "wb.example.com"
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`
	if resp := post("POST", init); resp.StatusCode != 200 {
		t.Errorf("initialize through a proxy: %d", resp.StatusCode)
	}
	if resp := post("GET", ""); resp.StatusCode != 405 {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}
}

// TestDesktopUseRecordedAwake: a call that uses a desktop (a tool call, a file sent), whose
// desktop is put to sleep between the call's look (running) and the record of its use, does
// not run on the session that the sleep is stopping: it waits for the sleep to end and wakes
// the desktop, as a call to an asleep desktop does. A Redis hook puts the desktop to sleep
// just before the call records its use. Before, the call ran at once, on that session (a
// loaded cold run saw one cut off with EOF as its guest stopped), and the desktop ended
// asleep.
func TestDesktopUseRecordedAwake(t *testing.T) {
	for _, tc := range []struct {
		name string
		use  func(t *testing.T, e *env, d desktop.Desktop)
	}{
		{"a tool call", func(t *testing.T, e *env, d desktop.Desktop) {
			res := callTool(t, e.mcpSession(d), "run_command", map[string]any{"command": "echo ran"})
			if !strings.Contains(textOf(res), `"stdout":"ran\n"`) {
				t.Errorf("the call: %s", textOf(res))
			}
		}},
		{"a file sent", func(t *testing.T, e *env, d desktop.Desktop) {
			files := "/v1/desktops/" + d.ID + "/files?path="
			e.mustDo("PUT", files+"a.txt", e.key, []byte("one"), 204, nil)
			if r := e.do("GET", files+"a.txt", e.key, nil); r.status != 200 || string(r.body) != "one" {
				t.Errorf("the file after the call: %d %s", r.status, r.body)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redistest.Server(t)
			e := newEnvOn(t, rdb)
			d := e.newDesktop(map[string]any{"name": "raced"})
			p, err := e.st.GetProject(context.Background(), e.projA)
			if err != nil {
				t.Fatal(err)
			}
			// The start's own record of a use (markUsed) comes before its idle deadline: once
			// that is set, the next record is the call's.
			e.waitFor(func() bool {
				due, _, err := e.st.DueDesktopIdle(context.Background(), time.Now().Add(time.Hour), 10)
				return err == nil && len(due) == 1 && due[0].ID == d.ID
			})
			// Just before the call records its use (the touch script: EVALSHA sha 1 key now),
			// put the desktop to sleep.
			slept := make(chan error, 1)
			redistest.BeforeOnce(rdb, func(cmd redis.Cmder) bool {
				args := cmd.Args()
				return cmd.Name() == "evalsha" && len(args) == 5 && strings.Contains(fmt.Sprint(args[3]), d.ID)
			}, func() error {
				_, err := e.gw.moveDesktop(context.Background(), p, d.ID, desktop.Sleep)
				slept <- err
				return nil
			})

			tc.use(t, e, d)
			select {
			case err := <-slept:
				if err != nil {
					t.Fatalf("the sleep before the use: %v", err)
				}
			default:
				t.Fatal("the call recorded no use of the desktop")
			}
			if got := e.desktop(d.ID); got.State != desktop.Running || got.SessionID == d.SessionID {
				t.Errorf("after the call the desktop is %s on session %s (it slept from %s), want running on a new one",
					got.State, got.SessionID, d.SessionID)
			}
		})
	}
}

// deafAgentGuests is the env's guests, but for their agents' clients, whose agent takes
// every call and never answers.
type deafAgentGuests struct {
	Guests
	sock string
}

func (g deafAgentGuests) Agent(context.Context, *session.Session) (*agent.Client, error) {
	return agent.NewClient(g.sock), nil
}

// TestDesktopMCPFileCallsAreBounded: a file tool's call to a desktop's agent that never
// answers ends at its bound (Config.DesktopFileTimeout) with a tool error that says so.
// Before, it lasted as long as its client waited, and kept the desktop awake all along (a
// tool call is a use).
func TestDesktopMCPFileCallsAreBounded(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "deaf.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	deaf := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	})}
	go func() { _ = deaf.Serve(ln) }()
	t.Cleanup(func() { _ = deaf.Close() })
	e := newEnv(t, func(c *Config) {
		c.DesktopFileTimeout = time.Second
		c.Guests = deafAgentGuests{Guests: c.Guests, sock: sock}
	})
	d := e.newDesktop(map[string]any{"name": "d"})
	cs := e.mcpSession(d)
	for name, args := range map[string]map[string]any{
		"read_file":  {"path": "a.txt"},
		"write_file": {"path": "a.txt", "content": "hello"},
		"list_files": {"path": "."},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		cancel()
		if err != nil || !res.IsError || !strings.Contains(textOf(res), "did not answer within 1s") {
			t.Errorf("%s of a desktop whose agent never answers: %v, %+v after %s; want a tool error that its agent did not answer within 1s",
				name, err, res, time.Since(start))
		}
	}
}

// TestDesktopMCPStalledCallerIsCut: an MCP call whose caller stays connected but takes none
// of its answer (read_file of a file of noise at its bound: some 22 MB of JSON) ends once a
// write to it waited WriteStall, which lets go of the handler and the answer's megabytes (the
// call is counted in /metrics as it ends). Before, such a caller (asking for a few on one
// connection) held both for as long as it stayed.
func TestDesktopMCPStalledCallerIsCut(t *testing.T) {
	var fn *fakenode.Node
	e := newEnv(t, func(c *Config) {
		fn = c.Guests.(*fakenode.Node)
		c.WriteStall = 3 * time.Second
	})
	d := e.newDesktop(map[string]any{"name": "d"})
	noise := make([]byte, MCPMaxFileBytes)
	_, _ = rand.Read(noise)
	if err := os.WriteFile(filepath.Join(fn.Dir, d.SessionID, "workspace", "big"), noise, 0o644); err != nil {
		t.Fatal(err)
	}
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"big"}}}`
	// A few, pipelined, as a caller that would fill every buffer on the way.
	stalledCall(t, e.srv.Listener.Addr().String(), e.key, "POST", "/v1/desktops/"+d.ID+"/mcp",
		"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-06-18\r\n", body, 3)
	// The caller now reads no more, and stays: the call ends within the stall.
	e.waitCounted("POST /v1/desktops/{id}/mcp", 200, 1, "an MCP call of read_file")
}

// TestDesktopMCPIdleStreamIsKept: an MCP stream with nothing to send (subscriptions/listen,
// which waits for the tools' list to change) stays open past WriteStall: the stall bounds
// writes under way, not a caller's wait for the next one.
func TestDesktopMCPIdleStreamIsKept(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WriteStall = 3 * time.Second })
	d := e.newDesktop(map[string]any{"name": "d"})
	const version = "2026-07-28"
	body := `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"` + version + `","io.modelcontextprotocol/clientCapabilities":{}}}}`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", d.MCPURL, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", version)
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("subscriptions/listen: %d %s %s; want a 200 stream", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	lines := make(chan string)
	ended := make(chan error, 1)
	go func() {
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				ended <- err
				return
			}
			lines <- line
		}
	}()
	// The acknowledgement's event, to its blank line.
	for acked, end := false, false; !end; {
		select {
		case line := <-lines:
			acked = acked || strings.Contains(line, "subscriptions/acknowledged")
			end = acked && line == "\n"
		case err := <-ended:
			t.Fatalf("subscriptions/listen ended before its acknowledgement: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("subscriptions/listen: no acknowledgement within 30 s")
		}
	}
	select {
	case err := <-ended:
		t.Fatalf("an idle subscriptions/listen stream ended (%v) within 5 s, with a 3 s stall; want it kept open", err)
	case line := <-lines:
		t.Fatalf("an idle subscriptions/listen stream sent %q; want nothing", line)
	case <-time.After(5 * time.Second):
	}
}

// mcpListen opens a subscriptions/listen stream to url with key. With a 200 it waits for the
// stream's acknowledgement and answers a func that closes the stream; otherwise it answers
// the status and body, validated against the OpenAPI document.
func mcpListen(t *testing.T, url, key string) (status int, body string, closeStream func()) {
	t.Helper()
	const version = "2026-07-28"
	msg := `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"` + version + `","io.modelcontextprotocol/clientCapabilities":{}}}}`
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(msg))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", version)
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		defer cancel()
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		validateResponse(t, req, resp, b)
		return resp.StatusCode, string(b), nil
	}
	if err := awaitAcknowledged(resp.Body); err != nil {
		cancel()
		t.Fatalf("subscriptions/listen: %v", err)
	}
	return 200, "", func() { cancel(); resp.Body.Close() }
}

// awaitAcknowledged reads a listen stream until its subscriptions/acknowledged line, for up
// to 30 s: once acknowledged, the stream holds its place among the desktop's.
func awaitAcknowledged(body io.Reader) error {
	acked := make(chan error, 1)
	go func() {
		r := bufio.NewReader(body)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				acked <- fmt.Errorf("the stream ended before its acknowledgement: %w", err)
				return
			}
			if strings.Contains(line, "subscriptions/acknowledged") {
				acked <- nil
				return
			}
		}
	}()
	select {
	case err := <-acked:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("no acknowledgement within 30 s")
	}
}

// TestDesktopMCPListenStreamsAreCapped: a desktop's MCP endpoint keeps at most
// DefaultMaxDesktopMCPListens subscriptions/listen streams open at once on a gateway; the one
// past them answers 429 too_many_listen_streams saying how many are allowed, and once one of
// them closes a new one is accepted. Other calls, and another desktop's streams, are not held
// up by them. Before, each listen held a goroutine and a connection for as long as its caller
// stayed, and a caller could open any number.
func TestDesktopMCPListenStreamsAreCapped(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "d"})
	other := e.newDesktop(map[string]any{"name": "other"})
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	for i := range DefaultMaxDesktopMCPListens {
		status, body, c := mcpListen(t, d.MCPURL, e.key)
		if status != 200 {
			t.Fatalf("listen stream %d of %d: %d %s; want a 200 stream", i+1, DefaultMaxDesktopMCPListens, status, body)
		}
		closers = append(closers, c)
	}
	status, body, c := mcpListen(t, d.MCPURL, e.key)
	if c != nil {
		closers = append(closers, c)
	}
	want := fmt.Sprintf("%d MCP listen streams", DefaultMaxDesktopMCPListens)
	if status != 429 || !strings.Contains(body, `"too_many_listen_streams"`) || !strings.Contains(body, want) {
		t.Fatalf("listen stream %d with %d open: %d %s; want 429 too_many_listen_streams saying %q", DefaultMaxDesktopMCPListens+1, DefaultMaxDesktopMCPListens, status, body, want)
	}
	// Another desktop's streams and this one's other calls are not held up.
	if status, body, c := mcpListen(t, other.MCPURL, e.key); status != 200 {
		t.Errorf("a listen stream of another desktop: %d %s; want a 200 stream", status, body)
	} else {
		c()
	}
	cs := e.mcpSession(d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Errorf("tools/list with the listen streams full: %v", err)
	}
	// A stream that closes gives its place back.
	closers[0]()
	closers = closers[1:]
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		status, body, c := mcpListen(t, d.MCPURL, e.key)
		if status == 200 {
			closers = append(closers, c)
			break
		}
		if status != 429 || time.Now().After(deadline) {
			t.Fatalf("a listen stream after one of %d closed: %d %s; want a 200 stream within a minute", DefaultMaxDesktopMCPListens, status, body)
		}
	}
	// The body read to count the streams is the SDK's to answer still: past 16 MiB, a 413.
	req, _ := http.NewRequest("POST", d.MCPURL, strings.NewReader(strings.Repeat("listen", (mcpMaxBodyBytes+6)/6)))
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 413 {
		t.Errorf("a message over 16 MiB: %d %s; want 413", resp.StatusCode, b)
	}
}

// TestMCPListensCounted: the listen streams a POST's body opens are counted as the SDK reads
// the body: a method spelled with JSON escapes, and each listen of a batch, count; "listen"
// in a tool call's arguments does not.
func TestMCPListensCounted(t *testing.T) {
	for _, c := range []struct {
		body string
		want int
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{}}`, 1},
		{`{"jsonrpc":"2.0","id":1,"method":"subscriptions\/listen","params":{}}`, 1},
		{`{"jsonrpc":"2.0","id":1,"method":"subscriptions/\u006cisten","params":{}}`, 1},
		{` [{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen"},{"jsonrpc":"2.0","id":2,"method":"subscriptions/listen"},{"jsonrpc":"2.0","id":3,"method":"ping"}]`, 2},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"nc -l subscriptions/listen"}}}`, 0},
		{`{"jsonrpc":"2.0","id":1,"method":"ping"}`, 0},
		{`not json, listen`, 0},
		// The SDK decodes a batch's first JSON value and ignores what follows it.
		{`[{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen"}] x`, 1},
		{`[{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen"}][`, 1},
	} {
		if got := mcpListens([]byte(c.body)); got != c.want {
			t.Errorf("mcpListens(%s) = %d, want %d", c.body, got, c.want)
		}
	}
}

// TestDesktopMCPBatchListenWithTrailingDataIsCapped: a batch whose array is followed by
// other bytes is read by the SDK as the array (its decoder takes the first JSON value), and
// its listen holds its stream open as any other: it counts among the desktop's listen
// streams, the one past DefaultMaxDesktopMCPListens answering 429. Before, the counter read
// such a body as no batch and counted none, so a caller opened any number.
func TestDesktopMCPBatchListenWithTrailingDataIsCapped(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "d"})
	body := `[{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true}}}] x`
	var cancels []func()
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for i := range DefaultMaxDesktopMCPListens + 1 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		req, _ := http.NewRequestWithContext(ctx, "POST", d.MCPURL, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if i < DefaultMaxDesktopMCPListens {
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("batch listen %d of %d: %d %s; want a 200 stream", i+1, DefaultMaxDesktopMCPListens, resp.StatusCode, b)
			}
			// Held open once acknowledged: its place is taken.
			if err := awaitAcknowledged(resp.Body); err != nil {
				t.Fatalf("batch listen %d: %v", i+1, err)
			}
			continue
		}
		if resp.StatusCode != 429 {
			// Not read: a stream held open has no end.
			t.Fatalf("batch listen %d with %d open: %d %s; want 429 too_many_listen_streams", i+1, DefaultMaxDesktopMCPListens, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `"too_many_listen_streams"`) {
			t.Fatalf("batch listen %d with %d open: %d %.200s; want 429 too_many_listen_streams", i+1, DefaultMaxDesktopMCPListens, resp.StatusCode, b)
		}
	}
}

// TestDesktopMCPWaitsAreCapped: tool calls waiting for a desktop to run hold their slot of
// the project's caps while they wait, as the files routes' do ("capped before a wake"), so a
// call past the cap answers the cap's tool error at once. Before, a call took its slot only
// once the desktop ran: a project could keep any number waiting on one starting desktop
// (thousands from a single POST of a JSON-RPC batch), each a goroutine of the gateway reading
// Redis every 50 ms for up to desktopWakeWait.
func TestDesktopMCPWaitsAreCapped(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxConcurrentExecs, c.MaxConcurrentFileCalls = 2, 1 })
	d := e.newDesktop(map[string]any{"name": "waited"})
	e.desktopAction(d.ID, "stop", 202)
	e.waitDesktop(d.ID, desktop.Stopped)
	e.node.SetStarts(false, true) // the next start never reports: the desktop stays starting
	e.desktopAction(d.ID, "start", 202)
	t.Cleanup(func() { e.node.SetStarts(false, false) })
	cs := e.mcpSession(d)

	// Two run_commands and a read_file wait for the desktop: the project's caps.
	waitCtx, stopWaits := context.WithCancel(context.Background())
	waited := make(chan struct{}, 3)
	for _, name := range []string{"run_command", "run_command", "read_file"} {
		args := map[string]any{"command": "true"}
		if name == "read_file" {
			args = map[string]any{"path": "a.txt"}
		}
		go func() {
			_, _ = cs.CallTool(waitCtx, &mcp.CallToolParams{Name: name, Arguments: args})
			waited <- struct{}{}
		}()
	}
	t.Cleanup(func() {
		// The waits end with the desktop's stop (a call does not wake a stopped desktop).
		e.desktopAction(d.ID, "stop", 202)
		stopWaits()
		for range 3 {
			<-waited
		}
	})
	slots := func() (execs, files int) {
		e.gw.execs.mu.Lock()
		defer e.gw.execs.mu.Unlock()
		e.gw.fileCalls.mu.Lock()
		defer e.gw.fileCalls.mu.Unlock()
		return e.gw.execs.n[e.projA], e.gw.fileCalls.n[e.projA]
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if x, f := slots(); x == 2 && f == 1 {
			break
		}
	}
	if got := e.desktop(d.ID); got.State != desktop.Starting {
		t.Fatalf("the desktop is %s, want starting", got.State)
	}
	// One call more of each kind, while they wait: refused at once, not one more waiter.
	for name, c := range map[string]struct {
		args map[string]any
		want string
	}{
		"run_command": {map[string]any{"command": "true"}, "2 execs in progress"},
		"read_file":   {map[string]any{"path": "a.txt"}, "1 file or screen calls in progress"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: c.args})
		cancel()
		x, f := slots()
		if err != nil || !res.IsError || !strings.Contains(textOf(res), c.want) {
			t.Errorf("%s with the project's calls waiting for the desktop (slots held: %d execs, %d file calls): %v, %s after %s; want the cap's tool error %q at once",
				name, x, f, err, describeResult(res), time.Since(start).Round(time.Millisecond), c.want)
		}
	}
}

// TestDesktopMCPCallerGoneEndsCalls: the tool calls of a POST whose caller went away end
// with it, and give their slots back: a batch of calls (JSON-RPC batches are served up to the
// 2025-03-26 protocol) waiting for a starting desktop is let go once its caller closes the
// connection. Before, the SDK's stateless handler gave the calls a context that the request's
// end did not cancel: they waited out desktopWakeWait (minutes), their slots held, with no one
// to answer.
func TestDesktopMCPCallerGoneEndsCalls(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxConcurrentExecs = 4 })
	d := e.newDesktop(map[string]any{"name": "left"})
	e.desktopAction(d.ID, "stop", 202)
	e.waitDesktop(d.ID, desktop.Stopped)
	e.node.SetStarts(false, true) // the next start never reports: the desktop stays starting
	e.desktopAction(d.ID, "start", 202)
	t.Cleanup(func() {
		e.node.SetStarts(false, false)
		e.desktopAction(d.ID, "stop", 202)
	})
	var batch []string
	for i := range 3 {
		batch = append(batch, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"true"}}}`, i+1))
	}
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	req, err := http.NewRequestWithContext(ctx, "POST", d.MCPURL, strings.NewReader("["+strings.Join(batch, ",")+"]"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	posted := make(chan struct{})
	go func() {
		defer close(posted)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	execs := func() int {
		e.gw.execs.mu.Lock()
		defer e.gw.execs.mu.Unlock()
		return e.gw.execs.n[e.projA]
	}
	for deadline := time.Now().Add(10 * time.Second); execs() != 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the batch's 3 calls waiting for the desktop hold %d exec slots, want 3", execs())
		}
	}
	leave()
	<-posted
	for deadline := time.Now().Add(10 * time.Second); execs() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d exec slots still held 10s after the batch's caller went away (the desktop is %s), want 0: its calls wait on for no one",
				execs(), e.desktop(d.ID).State)
		}
	}
}
