package desktop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"wb/client"
	"wb/desktop"
	"wb/desktop/guest"
	"wb/gateway"
	"wb/hypervisor/templates"
	"wb/session"
)

// mcpClient connects the official Go SDK's MCP client to the desktop's mcp_url, with the
// project's key through the wb SDK's MCPHTTPClient.
func (p *platform) mcpClient(d desktop.Desktop, opts *mcp.ClientOptions, sessOpts *mcp.ClientSessionOptions) *mcp.ClientSession {
	p.t.Helper()
	c, err := client.New(p.url, p.key)
	if err != nil {
		p.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "wb-desktop-test", Version: "1"}, opts).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: d.MCPURL, HTTPClient: c.MCPHTTPClient(), MaxRetries: -1}, sessOpts)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// tool calls a tool (a wake included: each call has its own generous deadline) and answers
// its result and its JSON-RPC error, if any.
func tool(cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if args == nil {
		args = map[string]any{}
	}
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
}

// mustTool calls a tool that must succeed and answers its text.
func mustTool(t testing.TB, cs *mcp.ClientSession, name string, args map[string]any) string {
	t.Helper()
	res, err := tool(cs, name, args)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error: %s", name, text(res))
	}
	return text(res)
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// command runs a shell command through run_command and answers its result.
func command(t testing.TB, cs *mcp.ClientSession, cmd string) session.ExecResult {
	t.Helper()
	var res session.ExecResult
	if err := json.Unmarshal([]byte(mustTool(t, cs, "run_command", map[string]any{"command": cmd})), &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// refused calls a tool that the desktop's state must refuse and answers the JSON-RPC error.
func refused(t testing.TB, cs *mcp.ClientSession, name string, args map[string]any) *jsonrpc.Error {
	t.Helper()
	res, err := tool(cs, name, args)
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		t.Fatalf("%s: want a JSON-RPC error, got %v (%+v)", name, err, res)
	}
	return we
}

// raw sends body as is and answers the status and the answer's body.
func (p *platform) raw(method, path string, body []byte) (int, []byte) {
	p.t.Helper()
	req, _ := http.NewRequest(method, p.url+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+p.key)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (p *platform) get(id string) desktop.Desktop {
	p.t.Helper()
	var d desktop.Desktop
	p.call("GET", "/v1/desktops/"+id, nil, 200, &d)
	return d
}

// TestDesktopMCPRealGuest: the official Go SDK's MCP client against a desktop with a real
// runsc guest. tools/list on an asleep desktop leaves it asleep; a tool call wakes it (from
// its saved state: a running process is back), waits, and answers; a listing of its files
// does not wake it, a file sent does; a tool call to a stopped desktop is a 409 JSON-RPC
// error and leaves it stopped.
func TestDesktopMCPRealGuest(t *testing.T) {
	t.Parallel()
	p := startPlatform(t, nil)
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "mcp"}, 201, &d)
	d = p.wait(d.ID, desktop.Running)
	cs := p.mcpClient(d, nil, nil)
	mustTool(t, cs, "write_file", map[string]any{"path": memoryDir + "/note", "content": "remembered"})
	command(t, cs, "sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > /workspace/bg.pid")

	p.call("POST", "/v1/desktops/"+d.ID+":sleep", nil, 202, nil)
	d = p.wait(d.ID, desktop.Asleep)
	if !d.StateSaved {
		t.Fatalf("asleep without its state: %s", d.Message)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 6 {
		t.Fatalf("tools/list: %v, %+v", err, tools)
	}
	fresh := p.mcpClient(d, nil, nil) // a new client's handshake, too
	if got := p.get(d.ID); got.State != desktop.Asleep || !got.LastUsedAt.Equal(d.LastUsedAt.Time) {
		t.Fatalf("after tools/list and a handshake: %s, last used %v (was %v)", got.State, got.LastUsedAt, d.LastUsedAt)
	}

	t0 := time.Now()
	res := command(t, fresh, `cat `+memoryDir+`/note; echo; tr '\0' ' ' < /proc/$(cat /workspace/bg.pid)/cmdline`)
	t.Logf("a tool call woke the desktop and answered in %v", time.Since(t0))
	if !strings.HasPrefix(res.Stdout, "remembered\n") || !strings.Contains(res.Stdout, "sleep 3600") {
		t.Errorf("after the wake: %+v", res)
	}
	if got := p.get(d.ID); got.State != desktop.Running {
		t.Fatalf("after a tool call: %s", got.State)
	}
	listing := mustTool(t, cs, "list_files", map[string]any{"path": memoryDir})
	if !strings.Contains(listing, `"name":"note"`) {
		t.Errorf("list_files: %s", listing)
	}
	if got := mustTool(t, cs, "read_file", map[string]any{"path": memoryDir + "/note"}); !strings.Contains(got, `"content":"remembered"`) {
		t.Errorf("read_file: %s", got)
	}

	// Files: a listing of an asleep desktop is 409 and leaves it asleep; a file sent wakes it.
	p.call("POST", "/v1/desktops/"+d.ID+":sleep", nil, 202, nil)
	d = p.wait(d.ID, desktop.Asleep)
	files := "/v1/desktops/" + d.ID + "/files?path="
	if status, body := p.raw("GET", files+memoryDir+"&list=1", nil); status != 409 || !strings.Contains(string(body), "asleep") {
		t.Errorf("listing an asleep desktop: %d %s", status, body)
	}
	if got := p.get(d.ID); got.State != desktop.Asleep {
		t.Fatalf("a listing moved it to %s", got.State)
	}
	if status, body := p.raw("PUT", files+memoryDir+"/sent", []byte("sent while asleep")); status != 204 {
		t.Fatalf("a file sent to an asleep desktop: %d %s", status, body)
	}
	if got := p.get(d.ID); got.State != desktop.Running {
		t.Fatalf("after a file sent: %s", got.State)
	}
	if status, body := p.raw("GET", files+memoryDir+"/sent", nil); status != 200 || string(body) != "sent while asleep" {
		t.Errorf("the file sent: %d %q", status, body)
	}

	// Stopped: 409 as a JSON-RPC error naming the state and what to do; it stays stopped.
	p.call("POST", "/v1/desktops/"+d.ID+":stop", nil, 202, nil)
	d = p.wait(d.ID, desktop.Stopped)
	we := refused(t, cs, "run_command", map[string]any{"command": "true"})
	if we.Code != 409 || !strings.Contains(we.Message, "stopped") || !strings.Contains(we.Message, ":start") {
		t.Errorf("a call to a stopped desktop: %d %q", we.Code, we.Message)
	}
	if got := p.get(d.ID); got.State != desktop.Stopped {
		t.Errorf("a refused call moved it to %s", got.State)
	}
}

// TestDesktopMCPFailedRealGuest: a desktop whose setup fails is failed, and a tool call to it
// is a 502 JSON-RPC error with its message.
func TestDesktopMCPFailedRealGuest(t *testing.T) {
	t.Parallel()
	p := startPlatform(t, func(c *gateway.Config) {
		c.DesktopSetup = func(ctx context.Context, ex desktop.Execer) error {
			_, _, code, err := ex.Exec(ctx, []string{"/bin/sh", "-c", "exit 7"}, nil)
			if err != nil {
				return err
			}
			return fmt.Errorf("the display exited %d", code)
		}
	})
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "fails"}, 201, &d)
	d = p.wait(d.ID, desktop.Failed)
	we := refused(t, p.mcpClient(d, nil, nil), "screenshot", nil)
	if we.Code != 502 || !strings.Contains(we.Message, "the display exited 7") {
		t.Errorf("a call to a failed desktop: %d %q", we.Code, we.Message)
	}
}

// TestDesktopMCPIdleRealGuest: a tool call longer than the idle time keeps the desktop awake
// to its end; then a connected MCP client that only pings (2025-11-25, keepalives) does not,
// and it sleeps after the idle time. (The SDK's keepalive closes the session at its first
// ping that misses half the period, by default: ten misses in a row are allowed, for a
// loaded machine.) The idle time is 15 s: a call records a use every quarter of it, one after
// another, and a loaded cold run (journal writes of 7 s, the placer woken 12 s late) took 6 s
// to record one; with 8 s the desktop fell idle at the end of the call.
func TestDesktopMCPIdleRealGuest(t *testing.T) {
	t.Parallel()
	const idle = 15 * time.Second
	p := startPlatform(t, func(c *gateway.Config) { c.DesktopIdle = idle })
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "idle"}, 201, &d)
	d = p.wait(d.ID, desktop.Running)
	cs := p.mcpClient(d, &mcp.ClientOptions{KeepAlive: time.Second, KeepAliveFailureThreshold: 10}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if res := command(t, cs, fmt.Sprintf("sleep %d; echo done", int(3*idle/2/time.Second))); res.Stdout != "done\n" {
		t.Fatalf("a long call: %+v", res)
	}
	if got := p.get(d.ID); got.State != desktop.Running {
		t.Fatalf("after a call longer than the idle time: %s", got.State)
	}
	t0 := time.Now()
	p.wait(d.ID, desktop.Asleep)
	if el := time.Since(t0); el < idle/2 {
		t.Errorf("asleep %v after the last call; idle is %v", el, idle)
	}
}

// TestDesktopMCPScreenshotAndJS with tpl_desktop (Xvfb, a window manager, Chromium): the
// screenshot tool answers a PNG of the display; run_js answers a script's value, in a fresh
// browser context each call (nothing kept between calls).
func TestDesktopMCPScreenshotAndJS(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/lib/chromium/chromium"); err != nil {
		t.Skip("Chromium is not installed (scripts/deps.sh)")
	}
	if shared, err := sharedFiles(); err == nil {
		if _, ok := shared.tpls[templates.Desktop]; !ok {
			t.Skipf("no %s: the host lacks some of %v", templates.Desktop, templates.DesktopPrograms())
		}
	}
	p := startPlatform(t, func(c *gateway.Config) {
		c.DesktopTemplate = templates.Desktop
		c.DesktopSetup = func(ctx context.Context, ex desktop.Execer) error { return guest.Start(ctx, ex) }
	})
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "screen"}, 201, &d)
	d = p.wait(d.ID, desktop.Running)
	cs := p.mcpClient(d, nil, nil)

	res, err := tool(cs, "screenshot", nil)
	if err != nil || res.IsError || len(res.Content) != 1 {
		t.Fatalf("screenshot: %v, %+v", err, res)
	}
	img, ok := res.Content[0].(*mcp.ImageContent)
	if !ok || img.MIMEType != "image/png" {
		t.Fatalf("screenshot answered %T", res.Content[0])
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(img.Data))
	if err != nil || cfg.Width != guest.Width || cfg.Height != guest.Height {
		t.Fatalf("screenshot: %v, %dx%d", err, cfg.Width, cfg.Height)
	}

	if got := mustTool(t, cs, "run_js", map[string]any{"script": "globalThis.wbMark = 7; 6 * globalThis.wbMark"}); got != "42" {
		t.Errorf("run_js: %s", got)
	}
	if got := mustTool(t, cs, "run_js", map[string]any{"script": "typeof globalThis.wbMark"}); got != `"undefined"` {
		t.Errorf("run_js kept a variable between calls: %s", got)
	}
	res, err = tool(cs, "run_js", map[string]any{"script": "throw new Error('boom')"})
	if err != nil || !res.IsError || !strings.Contains(text(res), "boom") {
		t.Errorf("run_js that throws: %v, %+v", err, res)
	}
	// A caller's time limit: an endless loop ends at it, and one beyond the most is refused.
	t0 := time.Now()
	res, err = tool(cs, "run_js", map[string]any{"script": "while (true) {}", "timeout_ms": 1000})
	if err != nil || !res.IsError || !strings.Contains(text(res), "did not finish in time") {
		t.Errorf("run_js of an endless loop with timeout_ms 1000: %v, %+v", err, res)
	}
	t.Logf("an endless loop with timeout_ms 1000 answered after %s", time.Since(t0))
	res, err = tool(cs, "run_js", map[string]any{"script": "1", "timeout_ms": 30001})
	if err != nil || !res.IsError || !strings.Contains(text(res), "timeout_ms must be 1 to 30000") {
		t.Errorf("run_js with timeout_ms 30001: %v, %+v", err, res)
	}
}
