package guest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// EvalCommand is the hidden subcommand of `wb agent` that RunJS runs in the guest.
const EvalCommand = "cdp-eval"

// evalOutput is what EvalMain prints: the script's value, or its error.
type evalOutput struct {
	Value json.RawMessage `json:"value,omitempty"`
	Error *evalError      `json:"error,omitempty"`
}

type evalError struct {
	Message string `json:"message"`
	Line    int    `json:"line,omitempty"` // 1-based
	Column  int    `json:"column,omitempty"`
	Timeout bool   `json:"timeout,omitempty"`
}

func (e *evalError) jsError() *JSError {
	return &JSError{Message: e.Message, Line: e.Line, Column: e.Column, Timeout: e.Timeout}
}

// EvalMain is `wb agent cdp-eval [--timeout-ms N | --ping]` in a desktop guest: it reads a
// script on stdin, evaluates it through Chromium's DevTools (the relay's socket, see
// RelayMain) in a new browser context (disposed afterwards), and prints one JSON object:
// {"value": …} or {"error": {"message", "line", "column", "timeout"}}. A failure to reach
// the browser is an error (exit 1), not an answer. --ping only checks that the browser
// answers.
func EvalMain(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("wb agent "+EvalCommand, flag.ContinueOnError)
	timeoutMs := fs.Int64("timeout-ms", RunJSTimeout.Milliseconds(), "how long the script may run")
	ping := fs.Bool("ping", false, "only check that the browser answers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ping {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := dialBrowser(pctx, relaySocket)
		if err != nil {
			return err
		}
		defer c.close()
		return c.call(pctx, "", "Browser.getVersion", nil, nil)
	}
	if *timeoutMs < 1 || *timeoutMs > time.Hour.Milliseconds() {
		return fmt.Errorf("--timeout-ms %d: want 1 ms to 1 h", *timeoutMs)
	}
	script, err := io.ReadAll(io.LimitReader(stdin, MaxScriptBytes+1))
	if err != nil {
		return fmt.Errorf("read the script: %w", err)
	}
	if len(script) > MaxScriptBytes {
		return fmt.Errorf("the script is more than %d bytes", MaxScriptBytes)
	}
	timeout := time.Duration(*timeoutMs) * time.Millisecond
	// Setting up and tearing down the context gets its own allowance beyond the script's:
	// on a loaded host a new renderer has taken more than ten seconds to answer.
	ctx, cancel := context.WithTimeout(ctx, timeout+setupAllowance)
	defer cancel()
	out, err := evaluate(ctx, relaySocket, string(script), timeout)
	if err != nil {
		return err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = stdout.Write(append(b, '\n'))
	return err
}

// setupAllowance bounds, beyond the script's own time, the making of a browser context and
// its renderer, and its disposal.
const setupAllowance = 30 * time.Second

// cdpConn is a DevTools connection to the browser target (flat sessions) through the relay.
type cdpConn struct {
	conn   net.Conn
	br     *bufio.Reader
	nextID int64
}

// dialBrowser connects to the relay. Message ids start at a random point: the relay serves
// clients one after another, and a late answer to an earlier client must not pass for ours.
func dialBrowser(ctx context.Context, socket string) (*cdpConn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("the browser's DevTools do not answer (is the desktop started?): %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	var b [4]byte // Chromium wants ids that fit an int32
	_, _ = rand.Read(b[:])
	return &cdpConn{conn: conn, br: bufio.NewReaderSize(conn, 64<<10), nextID: int64(binary.BigEndian.Uint32(b[:]) >> 2)}, nil
}

func (c *cdpConn) close() { _ = c.conn.Close() }

type cdpMessage struct {
	ID        int64           `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Params    any             `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// call sends one command and waits for its answer, skipping events and others' answers.
func (c *cdpConn) call(ctx context.Context, session, method string, params, result any) error {
	c.nextID++
	id := c.nextID
	b, err := json.Marshal(cdpMessage{ID: id, Method: method, SessionID: session, Params: params})
	if err != nil {
		return err
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(time.Hour)
	}
	_ = c.conn.SetDeadline(dl)
	if _, err := c.conn.Write(append(b, 0)); err != nil {
		return fmt.Errorf("devtools %s: %w", method, err)
	}
	for {
		data, err := readMessage(c.br, maxCDPMessage)
		if errors.Is(err, errTooLong) {
			return fmt.Errorf("devtools %s: %w", method, err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("devtools %s: %w", method, ctx.Err())
			}
			return fmt.Errorf("devtools %s: %w", method, err)
		}
		var m cdpMessage
		if err := json.Unmarshal(data[:len(data)-1], &m); err != nil {
			return fmt.Errorf("devtools %s: %w", method, err)
		}
		if m.ID != id {
			continue
		}
		return m.result(method, result)
	}
}

// result is an answer's error, or its result decoded into result (unless nil).
func (m *cdpMessage) result(method string, result any) error {
	if m.Error != nil {
		return fmt.Errorf("devtools %s: %s (%d)", method, m.Error.Message, m.Error.Code)
	}
	if result == nil {
		return nil
	}
	return json.Unmarshal(m.Result, result)
}

// remoteObject is the part of a CDP Runtime.RemoteObject that carries a value.
type remoteObject struct {
	Type                string          `json:"type"`
	Subtype             string          `json:"subtype"`
	Value               json.RawMessage `json:"value"`
	UnserializableValue string          `json:"unserializableValue"`
	Description         string          `json:"description"`
}

type exceptionDetails struct {
	Text         string        `json:"text"`
	LineNumber   int           `json:"lineNumber"`   // 0-based
	ColumnNumber int           `json:"columnNumber"` // 0-based
	Exception    *remoteObject `json:"exception"`
}

// evaluate runs script in a fresh browser context of the browser that the relay on socket
// serves: the relay's spare when one is ready, else one it makes (and disposes of). Either
// way the page's renderer answers before the script's time starts.
func evaluate(ctx context.Context, socket, script string, timeout time.Duration) (evalOutput, error) {
	c, err := dialBrowser(ctx, socket)
	if err != nil {
		return evalOutput{}, err
	}
	defer c.close()

	var s spare
	if err := c.call(ctx, "", claimSpareMethod, nil, &s); err != nil || s.SessionID == "" {
		// None ready (or a relay from before spares): make one. The relay disposes of a
		// spare once its client leaves; this one is ours to dispose of.
		made, err := newContext(ctx, c.call)
		if err != nil {
			return evalOutput{}, err
		}
		s = *made
		defer func() { _ = disposeContext(ctx, c.call, s.ContextID) }()
	}
	var res struct {
		Result           remoteObject      `json:"result"`
		ExceptionDetails *exceptionDetails `json:"exceptionDetails"`
	}
	// Runtime.evaluate's own timeout terminates a script that never yields; the context's
	// deadline (a few seconds later) covers a renderer that does not answer at all.
	ectx, cancel := context.WithTimeout(ctx, timeout+3*time.Second)
	defer cancel()
	started := time.Now()
	err = c.call(ectx, s.SessionID, "Runtime.evaluate", map[string]any{
		"expression": script, "returnByValue": true, "awaitPromise": true, "replMode": false,
		"timeout": timeout.Milliseconds(),
	}, &res)
	switch {
	case errors.Is(err, context.DeadlineExceeded) || ectx.Err() != nil:
		return evalOutput{Error: &evalError{Message: fmt.Sprintf("no answer within %s", timeout), Timeout: true}}, nil
	case err != nil && time.Since(started) >= timeout:
		// Chromium answers a script that its timeout terminated with an internal error.
		return evalOutput{Error: &evalError{Message: fmt.Sprintf("stopped after %s", timeout), Timeout: true}}, nil
	case errors.Is(err, errTooLong):
		return evalOutput{}, fmt.Errorf("the script's result is more than %d bytes; return less", MaxResultBytes)
	case err != nil:
		return evalOutput{}, err
	}
	if d := res.ExceptionDetails; d != nil {
		return evalOutput{Error: exceptionError(d, timeout)}, nil
	}
	v := valueOf(res.Result)
	if len(v) > MaxResultBytes {
		return evalOutput{Error: &evalError{Message: fmt.Sprintf("the script's result is %d bytes of JSON; at most %d: return less", len(v), MaxResultBytes)}}, nil
	}
	return evalOutput{Value: v}, nil
}

// exceptionError is a thrown exception in a person's terms: the exception's first line and
// where it was thrown.
func exceptionError(d *exceptionDetails, timeout time.Duration) *evalError {
	msg := d.Text
	if d.Exception != nil && d.Exception.Description != "" {
		msg, _, _ = strings.Cut(d.Exception.Description, "\n") // the message, not V8's stack
		if !strings.HasPrefix(msg, "Uncaught") && d.Text == "Uncaught" {
			msg = "Uncaught " + msg
		}
	} else if d.Exception != nil && len(d.Exception.Value) > 0 {
		msg = d.Text + " " + string(d.Exception.Value) // e.g. throw "a string"
	}
	if strings.Contains(msg, "Execution was terminated") || strings.Contains(d.Text, "Execution was terminated") {
		return &evalError{Message: fmt.Sprintf("stopped after %s", timeout), Timeout: true}
	}
	return &evalError{Message: msg, Line: d.LineNumber + 1, Column: d.ColumnNumber + 1}
}

// valueOf is a remote object as JSON: its value, a JSON string for values JSON cannot hold
// (NaN, Infinity, -0, bigint), and null for undefined.
func valueOf(o remoteObject) json.RawMessage {
	switch {
	case o.UnserializableValue != "":
		b, _ := json.Marshal(o.UnserializableValue)
		return b
	case len(o.Value) > 0:
		return o.Value
	}
	return json.RawMessage("null")
}

// AgentCommand runs one of this package's hidden `wb agent` subcommands (cdp-eval,
// cdp-relay), which run inside a desktop guest; args are those after "agent". It answers
// false when args name none of them. Both wb and wb-agent call it, since a guest may run either.
func AgentCommand(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) (bool, error) {
	if len(args) == 0 {
		return false, nil
	}
	switch args[0] {
	case EvalCommand: // RunJS
		return true, EvalMain(ctx, args[1:], stdin, stdout)
	case RelayCommand: // the desktop's Chromium
		return true, RelayMain(ctx, args[1:])
	}
	return false, nil
}
