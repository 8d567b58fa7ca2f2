package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	segjson "github.com/segmentio/encoding/json"

	"wb/agent"
	"wb/desktop"
	"wb/desktop/guest"
	"wb/node/nodeapi"
	"wb/session"
	"wb/store"
)

// Each desktop's MCP endpoint (its mcp_url, /v1/desktops/{id}/mcp) is Streamable HTTP from
// the official Go SDK, behind the API's bearer auth: the key's project must own the desktop
// (another project's desktop is a 404, as on the API). The handler is stateless: each POST
// gets a fresh server bound to its desktop, so any gateway answers any call, nothing is kept
// per client, and a connected client that does not call holds nothing open (no standalone
// stream; GET answers 405). An answer's writes are bounded by WriteStall (stallBounded): a
// caller that stays connected but takes none of a result of megabytes (read_file's,
// screenshot's) ends the call, which otherwise held the handler and the result; a stream
// with nothing to send (subscriptions/listen, waiting for notifications) is not cut, and so
// holds a goroutine and the caller's connection for as long as the caller stays: a desktop
// has at most MaxDesktopMCPListens of them open at once on a gateway (429 past it). Only a
// tool call touches the desktop: initialize, discovery, tools/list and pings neither wake it
// nor count as use. A tool call's arguments are checked first (each tool's check, all that
// needs no round trip): a call its tool refuses answers that tool error and neither wakes
// the desktop (a guest started, and billed, for nothing) nor takes a slot of the project's
// caps. A tool call waits for the desktop to run (awakeDesktop, waking it), is a use from
// its start to its end, and turns a refusal (stopped, failed, no room) into a
// JSON-RPC error the client shows (mcpCallError); a tool that ran and failed (a file not
// found, a script that threw) is a tool result with isError,
// as the MCP spec has it.

// Bounds of the MCP endpoint.
const (
	// mcpMaxBodyBytes bounds one request: a write_file's content, base64, with room to spare.
	mcpMaxBodyBytes = 16 << 20
	// MCPMaxFileBytes bounds the file read_file answers and write_file writes (the files
	// routes take up to MaxFileBytes).
	MCPMaxFileBytes = 8 << 20
	// DefaultDesktopFileTimeout bounds an MCP file tool's call to the desktop's agent (read,
	// write or list, of at most MCPMaxFileBytes). Without a bound, an agent that never
	// answered held the call for as long as its client waited, and the desktop awake (a
	// call is a use).
	DefaultDesktopFileTimeout = time.Minute
	// mcpScreenshotTimeout bounds a screenshot's capture and transfer.
	mcpScreenshotTimeout = time.Minute
	// mcpMostTouchEvery bounds the period of a long tool call's uses (TouchDesktop).
	mcpMostTouchEvery = time.Minute
)

// desktopMCP serves the MCP endpoints of a Server's desktops.
type desktopMCP struct {
	s       *Server
	handler *mcp.StreamableHTTPHandler
	// schemas keeps the tools' JSON schemas, reflected once instead of per request.
	schemas *mcp.SchemaCache
	// listens counts the open listen streams per desktop (MaxDesktopMCPListens).
	listens *projectSlots
}

// mcpServerKey carries the request's MCP server (bound to its desktop) to the handler.
type mcpServerKey struct{}

func newDesktopMCP(s *Server) *desktopMCP {
	m := &desktopMCP{s: s, schemas: mcp.NewSchemaCache(), listens: newProjectSlots("MCP listen stream", "too_many_listen_streams")}
	m.handler = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		srv, _ := r.Context().Value(mcpServerKey{}).(*mcp.Server)
		return srv
	}, &mcp.StreamableHTTPOptions{
		Stateless: true,
		// The SDK's DNS-rebinding guard refuses a loopback listener's requests whose Host is
		// not loopback: exactly what a gateway behind a local TLS proxy receives. The guard
		// protects unauthenticated local servers; this endpoint needs the project's key.
		DisableLocalhostProtection: true,
		MaxRequestBodyBytes:        mcpMaxBodyBytes,
		Logger:                     s.log,
	})
	return m
}

// serve is the endpoint's handler: authenticated by the API, the desktop looked up in the
// key's project (a read: it neither wakes the desktop nor counts as use).
func (m *desktopMCP) serve(w http.ResponseWriter, r *http.Request, p store.Project) error {
	id := r.PathValue("id")
	rec, err := m.s.loadDesktop(r, p, id)
	if err != nil {
		return err
	}
	if r.Method == http.MethodPost {
		body, err := readMCPBody(w, r)
		if n := mcpListens(body); n > 0 {
			key := p.ID + "/" + rec.ID
			max := cmp.Or(m.s.MaxDesktopMCPListens, DefaultMaxDesktopMCPListens)
			if !m.listens.take(key, n, max) {
				return &apiError{Status: http.StatusTooManyRequests, Type: "rate_limited", Code: m.listens.code,
					Message: fmt.Sprintf("desktop %s already has %d MCP listen streams (subscriptions/listen) open on this gateway, the most it may have at once; close one of them before opening another", rec.ID, max)}
			}
			defer m.listens.give(key, n)
		}
		// The SDK reads the body again, and answers a failed read (413 past mcpMaxBodyBytes).
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
	}
	srv := m.server(r.Context(), p, rec)
	m.handler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), mcpServerKey{}, srv)))
	return nil
}

// readMCPBody reads the body of r, at most mcpMaxBodyBytes; err is the read's failure (nil
// at its end), with what was read before it.
func readMCPBody(w http.ResponseWriter, r *http.Request) (body []byte, err error) {
	body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, mcpMaxBodyBytes))
	if err == nil {
		err = io.EOF
	}
	return body, err
}

// errReader answers err to every read.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// mcpListens counts the subscriptions/listen requests of body, a JSON-RPC message or a batch
// of them, read as the SDK reads it (readBatch, jsonrpc.DecodeMessage): each holds its stream
// open.
func mcpListens(body []byte) int {
	// Only a body with "listen" in it, or a \u escape that may spell it, can have one: a
	// tool call's megabytes need no second decoding.
	if !bytes.Contains(body, []byte("listen")) && !bytes.Contains(body, []byte(`\u`)) {
		return 0
	}
	// A batch is read as the SDK's readBatch reads it: its decoder takes the first JSON value
	// and ignores what follows (json.Unmarshal refuses that, and would count none of a batch
	// that the SDK serves).
	var msgs []json.RawMessage
	dec := segjson.NewDecoder(bytes.NewReader(body))
	dec.DontMatchCaseInsensitiveStructFields()
	if dec.Decode(&msgs) != nil {
		msgs = []json.RawMessage{body}
	}
	n := 0
	for _, raw := range msgs {
		if msg, err := jsonrpc.DecodeMessage(raw); err == nil {
			if req, ok := msg.(*jsonrpc.Request); ok && req.Method == "subscriptions/listen" {
				n++
			}
		}
	}
	return n
}

// server makes the MCP server of one request to desktop rec, whose context is caller.
func (m *desktopMCP) server(caller context.Context, p store.Project, rec desktop.Record) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "wb-desktop", Title: "wb desktop " + rec.Name, Version: "1"}, &mcp.ServerOptions{
		SchemaCache: m.schemas,
		Instructions: "The tools act on the desktop " + rec.ID + " (" + rec.Name + "): a Linux machine with a display and a Chromium browser. " +
			"A call to an asleep desktop wakes it first (seconds); a stopped desktop must be started through the API first.",
	})
	t := &desktopTools{s: m.s, p: p, id: rec.ID, caller: caller}
	mcp.AddTool(srv, &mcp.Tool{Name: "run_command", Description: "Run a command on the desktop and answer its stdout, stderr and exit code. " +
		"Give command (a shell command line, run with /bin/sh -c) or argv (a program and its arguments, no shell)."}, useTool(t, checkRunCommand, t.execCap(), t.runCommand))
	mcp.AddTool(srv, &mcp.Tool{Name: "read_file", Description: fmt.Sprintf("Read a file of the desktop (at most %d MiB): UTF-8 text as is, anything else base64.", MCPMaxFileBytes>>20)},
		useTool(t, checkPathInput, t.fileCap(), t.readFile))
	mcp.AddTool(srv, &mcp.Tool{Name: "write_file", Description: "Write a file on the desktop, making its directories; content is UTF-8 text, or base64 with encoding \"base64\"."},
		useTool(t, t.checkWriteFile, t.fileCap(), t.writeFile))
	mcp.AddTool(srv, &mcp.Tool{Name: "list_files", Description: "List a directory of the desktop."}, useTool(t, checkPathInput, t.fileCap(), t.listFiles))
	mcp.AddTool(srv, &mcp.Tool{Name: "screenshot", Description: "A PNG image of the desktop's whole display."}, useTool(t, nil, t.fileCap(), t.screenshot))
	mcp.AddTool(srv, &mcp.Tool{Name: "run_js", Description: "Run JavaScript in the desktop's browser, in a fresh browser context (nothing is kept between calls), " +
		fmt.Sprintf("and answer its value as JSON (a promise is awaited; at most %d MiB of it).", guest.MaxResultBytes>>20)}, useTool(t, checkRunJS, t.execCap(), t.runJS))
	return srv
}

// desktopTools are the tools of one desktop of project p.
type desktopTools struct {
	s  *Server
	p  store.Project
	id string
	// caller is the context of the POST that carries the calls: the server is made for that
	// one request (stateless), and its calls end with it (useTool).
	caller context.Context
}

// useTool wraps a tool's work: its arguments must pass check (nil: none to check), the call
// takes one of the project's slots of its kind (c), the desktop must run (useDesktop with
// desktop.MCP wakes an asleep one and waits), a refusal is a JSON-RPC error, and the call is a
// use of the desktop for as long as it runs. The check comes first, so that arguments the
// tool refuses wake no desktop, take no slot, and answer the same tool error however busy or
// asleep the desktop is. The slot comes before the wait, as the files routes' does ("capped
// before a wake"): a call past the cap wakes nothing, and a project cannot keep more calls
// waiting for a desktop (each a goroutine reading Redis every desktopWaitMost, for up to
// desktopWakeWait) than its cap.
func useTool[In, Out any](t *desktopTools, check func(In) error, c toolCap, work func(ctx context.Context, sess *session.Session, in In) (*mcp.CallToolResult, Out, error)) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		if check != nil {
			if err := check(in); err != nil {
				return nil, zero, errors.New(toolMessage(err))
			}
		}
		// A call ends with its POST: the SDK's context for it (before the 2026-07-28 protocol)
		// outlives the request, and a caller that went away left calls waiting out
		// desktopWakeWait, their slots held, to answer no one (a stateless server keeps no
		// stream to resume).
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(t.caller, cancel)()
		// Past the cap the call is a tool error that says so.
		if err := c.ps.acquire(t.p.ID, c.max); err != nil {
			return nil, zero, errors.New(toolMessage(err))
		}
		defer c.ps.release(t.p.ID)
		sess, err := t.s.useDesktop(ctx, t.p, t.id, desktop.MCP)
		if err != nil {
			if ae := toAPIError(err); ae.Code == "internal" && ctx.Err() == nil {
				t.s.log.ErrorContext(ctx, "desktop mcp: wait for the desktop", "desktop", t.id, "err", err)
			}
			return nil, zero, mcpCallError(err)
		}
		defer t.s.holdDesktop(ctx, t.p.ID, t.id)()
		res, out, err := work(ctx, sess, in)
		if err != nil {
			// A failure of the tool's work is its result (isError), with the API's words.
			return nil, zero, errors.New(toolMessage(err))
		}
		return res, out, nil
	}
}

// toolCap is the project's cap a tool's call counts among: at most max at once in ps.
type toolCap struct {
	ps  *projectSlots
	max int
}

// fileCap counts a call of a file tool or of screenshot among the project's file calls, as
// the API's files routes and screen do (Server.fileCall): each holds as much of the gateway.
func (t *desktopTools) fileCap() toolCap { return toolCap{t.s.fileCalls, t.s.maxFileCalls()} }

// execCap counts a call of run_command or run_js among the project's execs, as the exec route
// does (Config.MaxConcurrentExecs): each runs a command in the guest for as long as its
// timeout.
func (t *desktopTools) execCap() toolCap {
	return toolCap{t.s.execs, cmp.Or(t.s.MaxConcurrentExecs, DefaultMaxConcurrentExecs)}
}

// toolMessage is what a tool's caller reads of err: the API's message for an API error, the
// error itself for a tool's own (a script's exception, a bad argument).
func toolMessage(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Message
	}
	var je *guest.JSError
	if errors.As(err, &je) {
		return je.Error()
	}
	return redactInternal(err.Error())
}

// holdDesktop records uses of the desktop from now until the returned func is called (and
// then once more), after the one useDesktop recorded as the call began: a tool call is a use
// for as long as it runs (seed 001), so a call longer than the idle time keeps the desktop
// awake. Each use is recorded on the desktop first, and passed on to its session in the
// background, one at a time: the session's node may take seconds to answer (its guest's
// lock, a journal write on a busy disk), and the desktop must not fall idle meanwhile.
func (s *Server) holdDesktop(ctx context.Context, project, id string) (release func()) {
	ctx = context.WithoutCancel(ctx)
	every := min(max(s.desktopIdle()/4, 100*time.Millisecond), mcpMostTouchEvery)
	var passing atomic.Bool // a use on its way to the session
	touch := func() {
		start := time.Now()
		awake, err := s.recordDesktopUse(ctx, project, id)
		if err != nil {
			s.log.WarnContext(ctx, "desktop mcp: record a use", "desktop", id, "err", err)
		}
		// The next use is recorded only after this one: one that takes the idle time lets
		// the desktop fall idle during the call.
		if took := time.Since(start); took > every {
			s.log.WarnContext(ctx, "desktop mcp: recording a use was slow", "desktop", id, "took", took, "every", every)
		}
		if awake && passing.CompareAndSwap(false, true) {
			go func() {
				defer passing.Store(false)
				s.touchDesktopSession(ctx, project, id)
			}()
		}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				touch()
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		touch()
	}
}

// mcpCallError is what an MCP client shows for a tool call refused before it ran (the
// desktop stopped, failed, without room, gone): a JSON-RPC error whose code is the API's
// HTTP status (an application code, outside JSON-RPC's reserved -32768..-32000), whose
// message starts with that status and the API's code, and whose data is the API's error
// object with the status.
func mcpCallError(err error) *jsonrpc.Error {
	ae := toAPIError(err)
	data, _ := json.Marshal(struct {
		Status int `json:"status"`
		*apiError
	}{ae.Status, ae})
	return &jsonrpc.Error{Code: int64(ae.Status), Message: fmt.Sprintf("%d %s: %s", ae.Status, ae.Code, ae.Message), Data: data}
}

// RunCommandInput is run_command's arguments.
type RunCommandInput struct {
	Command  string            `json:"command,omitempty" jsonschema:"a shell command line, run with /bin/sh -c (give this or argv)"`
	Argv     []string          `json:"argv,omitempty" jsonschema:"a program and its arguments, run without a shell (give this or command)"`
	Stdin    string            `json:"stdin,omitempty" jsonschema:"text to send to the command's standard input"`
	Cwd      string            `json:"cwd,omitempty" jsonschema:"the working directory (default: the desktop's workspace)"`
	Env      map[string]string `json:"env,omitempty" jsonschema:"environment variables to add"`
	TimeoutS int               `json:"timeout_s,omitempty" jsonschema:"seconds the command may run (default 60, at most 3600)"`
}

// execRequest is the exec of run_command's arguments, checked as the exec route checks its
// own (ExecRequest.Argv).
func (in RunCommandInput) execRequest() (session.ExecRequest, error) {
	var cmd any
	switch {
	case in.Command != "" && len(in.Argv) > 0:
		return session.ExecRequest{}, errors.New("give command or argv, not both")
	case in.Command != "":
		cmd = in.Command
	case len(in.Argv) > 0:
		cmd = in.Argv
	default:
		return session.ExecRequest{}, errors.New("command or argv is required: a shell command line, or a program and its arguments")
	}
	raw, err := json.Marshal(cmd)
	if err != nil {
		return session.ExecRequest{}, err
	}
	req := session.ExecRequest{Command: raw, Env: in.Env, Cwd: in.Cwd, Stdin: in.Stdin}
	if in.TimeoutS != 0 {
		req.TimeoutS = &in.TimeoutS
	}
	if _, err := req.Argv(); err != nil {
		return session.ExecRequest{}, err
	}
	return req, nil
}

// checkRunCommand is run_command's check (useTool).
func checkRunCommand(in RunCommandInput) error {
	_, err := in.execRequest()
	return err
}

func (t *desktopTools) runCommand(ctx context.Context, sess *session.Session, in RunCommandInput) (*mcp.CallToolResult, session.ExecResult, error) {
	req, err := in.execRequest()
	if err != nil {
		return nil, session.ExecResult{}, err
	}
	res, err := t.s.runExec(ctx, sess, req, nil)
	return nil, res, err
}

// PathInput is the argument of read_file and list_files.
type PathInput struct {
	Path string `json:"path" jsonschema:"the path in the desktop, absolute or relative to its workspace"`
}

// ReadFileOutput is read_file's answer.
type ReadFileOutput struct {
	Path     string `json:"path"`
	Size     int    `json:"size"`
	Encoding string `json:"encoding" jsonschema:"utf-8 for text, else base64"`
	Content  string `json:"content"`
}

func (t *desktopTools) agent(ctx context.Context, sess *session.Session) (*agent.Client, error) {
	g, err := t.s.guests()
	if err != nil {
		return nil, err
	}
	c, err := g.Agent(nodeapi.WithAgentKind(ctx, nodeapi.AgentKindFiles), sess)
	if err != nil {
		return nil, t.s.errNode(ctx, "node_error", "the node could not reach the desktop", err)
	}
	return c, nil
}

// agentBound bounds a file tool's call to the desktop's agent (DesktopFileTimeout); late is
// the call's error past the bound (agentFailed).
func (t *desktopTools) agentBound(ctx context.Context) (_ context.Context, _ context.CancelFunc, late error) {
	wait := cmp.Or(t.s.DesktopFileTimeout, DefaultDesktopFileTimeout)
	late = fmt.Errorf("the desktop's agent did not answer within %s; try again", wait)
	ctx, cancel := context.WithTimeoutCause(ctx, wait, late)
	return ctx, cancel, late
}

// agentFailed is the error of a file tool's call to the agent that failed: late when its
// bound (agentBound) ended it, else the agent's answer.
func (t *desktopTools) agentFailed(ctx context.Context, late, err error) error {
	if errors.Is(context.Cause(ctx), late) {
		return late
	}
	return t.s.agentError(ctx, err)
}

func checkPath(p string) error {
	if p == "" {
		return errors.New("path is required")
	}
	if len(p) > 4096 || strings.ContainsRune(p, 0) {
		return errors.New("path: not a usable path")
	}
	return nil
}

// checkPathInput is the check (useTool) of read_file and list_files.
func checkPathInput(in PathInput) error { return checkPath(in.Path) }

func (t *desktopTools) readFile(ctx context.Context, sess *session.Session, in PathInput) (*mcp.CallToolResult, ReadFileOutput, error) {
	var out ReadFileOutput
	c, err := t.agent(ctx, sess)
	if err != nil {
		return nil, out, err
	}
	ctx, cancel, late := t.agentBound(ctx)
	defer cancel()
	rc, err := c.OpenFile(ctx, in.Path)
	if err != nil {
		return nil, out, t.agentFailed(ctx, late, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MCPMaxFileBytes+1))
	if err != nil && errors.Is(context.Cause(ctx), late) {
		return nil, out, late
	}
	if err != nil {
		return nil, out, t.s.errUpstream(ctx, "node_error", "reading the file failed", err)
	}
	if len(b) > MCPMaxFileBytes {
		return nil, out, fmt.Errorf("%s is larger than %d MiB: read a part with run_command (head -c, tail -c), or download it with GET /v1/desktops/%s/files", in.Path, MCPMaxFileBytes>>20, t.id)
	}
	out = ReadFileOutput{Path: in.Path, Size: len(b), Encoding: "utf-8", Content: string(b)}
	if !utf8.Valid(b) {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(b)
	}
	return nil, out, nil
}

// WriteFileInput is write_file's arguments.
type WriteFileInput struct {
	Path     string `json:"path" jsonschema:"the path in the desktop, absolute or relative to its workspace"`
	Content  string `json:"content" jsonschema:"the file's content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64"`
}

// WriteFileOutput is write_file's answer.
type WriteFileOutput struct {
	Path string `json:"path"`
	Size int    `json:"size"`
}

// content is the bytes write_file's arguments write, checked.
func (t *desktopTools) content(in WriteFileInput) ([]byte, error) {
	if err := checkPath(in.Path); err != nil {
		return nil, err
	}
	b := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8":
	case "base64":
		var err error
		if b, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, fmt.Errorf("content: not base64: %w", err)
		}
	default:
		return nil, fmt.Errorf("encoding: %q is neither utf-8 nor base64", in.Encoding)
	}
	if len(b) > MCPMaxFileBytes {
		return nil, fmt.Errorf("content is %d bytes; write_file takes at most %d MiB (PUT /v1/desktops/%s/files takes more)", len(b), MCPMaxFileBytes>>20, t.id)
	}
	return b, nil
}

// checkWriteFile checks write_file's arguments: base64 content is decoded here and again by
// the call, some milliseconds for the largest, which a body of megabytes outweighs.
func (t *desktopTools) checkWriteFile(in WriteFileInput) error {
	_, err := t.content(in)
	return err
}

func (t *desktopTools) writeFile(ctx context.Context, sess *session.Session, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	var out WriteFileOutput
	b, err := t.content(in)
	if err != nil {
		return nil, out, err
	}
	c, err := t.agent(ctx, sess)
	if err != nil {
		return nil, out, err
	}
	ctx, cancel, late := t.agentBound(ctx)
	defer cancel()
	if err := c.WriteFile(ctx, in.Path, strings.NewReader(string(b)), 0o644); err != nil {
		return nil, out, t.agentFailed(ctx, late, err)
	}
	return nil, WriteFileOutput{Path: in.Path, Size: len(b)}, nil
}

// FileEntry is one entry of list_files' answer.
type FileEntry struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Mode    string `json:"mode" jsonschema:"permission bits in octal"`
	IsDir   bool   `json:"is_dir"`
	ModTime string `json:"mod_time" jsonschema:"RFC 3339"`
}

// ListFilesOutput is list_files' answer.
type ListFilesOutput struct {
	Path    string      `json:"path"`
	Entries []FileEntry `json:"entries"`
}

func (t *desktopTools) listFiles(ctx context.Context, sess *session.Session, in PathInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	out := ListFilesOutput{Path: in.Path, Entries: []FileEntry{}}
	c, err := t.agent(ctx, sess)
	if err != nil {
		return nil, out, err
	}
	ctx, cancel, late := t.agentBound(ctx)
	defer cancel()
	entries, err := c.ListDir(ctx, in.Path)
	if err != nil {
		return nil, out, t.agentFailed(ctx, late, err)
	}
	for _, e := range entries {
		out.Entries = append(out.Entries, FileEntry{Name: e.Name, Size: e.Size, Mode: e.Mode, IsDir: e.IsDir, ModTime: e.ModTime.UTC().Format(time.RFC3339)})
	}
	return nil, out, nil
}

func (t *desktopTools) screenshot(ctx context.Context, sess *session.Session, _ struct{}) (*mcp.CallToolResult, any, error) {
	ctx, cancel := context.WithTimeout(ctx, mcpScreenshotTimeout)
	defer cancel()
	png, err := guest.Screenshot(ctx, sessionExecer{s: t.s, sess: sess})
	if err != nil {
		return nil, nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.ImageContent{Data: png, MIMEType: "image/png"}}}, nil, nil
}

// RunJSInput is run_js's argument.
type RunJSInput struct {
	Script    string `json:"script" jsonschema:"JavaScript to evaluate in a fresh browser context; its value (a promise is awaited) is the answer"`
	TimeoutMs int64  `json:"timeout_ms,omitempty" jsonschema:"how long the script may run, in milliseconds: 1 to 30000 (the default)"`
}

// checkRunJS is run_js's check (useTool): its own bound of timeout_ms, then RunJS's checks
// (the script's size and emptiness).
func checkRunJS(in RunJSInput) error {
	if in.TimeoutMs < 0 || in.TimeoutMs > guest.RunJSTimeout.Milliseconds() {
		return fmt.Errorf("timeout_ms must be 1 to %d (milliseconds), got %d", guest.RunJSTimeout.Milliseconds(), in.TimeoutMs)
	}
	return guest.CheckRunJS(in.Script, time.Duration(in.TimeoutMs)*time.Millisecond)
}

func (t *desktopTools) runJS(ctx context.Context, sess *session.Session, in RunJSInput) (*mcp.CallToolResult, any, error) {
	// RunJS keeps 5 s of the deadline to tear its context down and answer.
	ctx, cancel := context.WithTimeout(ctx, guest.RunJSTimeout+10*time.Second)
	defer cancel()
	v, err := guest.RunJS(ctx, sessionExecer{s: t.s, sess: sess}, in.Script, time.Duration(in.TimeoutMs)*time.Millisecond)
	if err != nil {
		return nil, nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(v)}}}, nil, nil
}
