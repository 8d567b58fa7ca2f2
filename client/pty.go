package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

// PTYRequest opens a terminal: Cols×Rows (0: the server's 80×24) running Command under
// /bin/sh -c (empty: an interactive /bin/sh).
type PTYRequest struct {
	Cols, Rows int
	Command    string
}

// PTY is a terminal in a running session: an io.ReadWriteCloser of the terminal's bytes, with
// Resize. Read answers io.EOF once the process exited (ExitCode then has its code) or the
// connection closed. One reader and one writer may use it at once.
type PTY struct {
	conn   *websocket.Conn
	ctx    context.Context // the connection's life: ended by Close
	cancel context.CancelFunc

	readMu  sync.Mutex
	pending []byte

	exitMu   sync.Mutex
	exitCode *int
}

// OpenPTY opens a terminal in a running session over the API's WebSocket. ctx bounds the
// handshake only; Close ends the terminal.
func (c *Client) OpenPTY(ctx context.Context, sessionID string, req PTYRequest) (*PTY, error) {
	q := url.Values{}
	if req.Cols > 0 {
		q.Set("cols", strconv.Itoa(req.Cols))
	}
	if req.Rows > 0 {
		q.Set("rows", strconv.Itoa(req.Rows))
	}
	if req.Command != "" {
		q.Set("command", req.Command)
	}
	u := c.url("/v1/sessions/"+pathID(sessionID)+"/pty", q)
	hdr := http.Header{}
	hdr.Set("Authorization", "Bearer "+c.apiKey)
	hdr.Set("User-Agent", c.userAgent)
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: hdr})
	if err != nil {
		// A refused upgrade answers the API's error body: give it as *Error.
		if resp != nil && resp.StatusCode >= 400 {
			return nil, readError(resp)
		}
		return nil, fmt.Errorf("wb: open the pty of %s: %w", sessionID, err)
	}
	conn.SetReadLimit(1 << 20)
	pctx, cancel := context.WithCancel(context.Background())
	return &PTY{conn: conn, ctx: pctx, cancel: cancel}, nil
}

// ptyMessage is a text frame: a resize (to the guest) or the process's exit (from it).
type ptyMessage struct {
	Type     string `json:"type"`
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
}

// Read reads the terminal's output.
func (p *PTY) Read(b []byte) (int, error) {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	for len(p.pending) == 0 {
		typ, data, err := p.conn.Read(p.ctx)
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure || errors.Is(err, context.Canceled) {
				return 0, io.EOF
			}
			return 0, fmt.Errorf("wb: pty: %w", err)
		}
		if typ == websocket.MessageText {
			var m ptyMessage
			if json.Unmarshal(data, &m) == nil && m.Type == "exit" && m.ExitCode != nil {
				p.exitMu.Lock()
				p.exitCode = m.ExitCode
				p.exitMu.Unlock()
			}
			continue
		}
		p.pending = data
	}
	n := copy(b, p.pending)
	p.pending = p.pending[n:]
	return n, nil
}

// Write sends keystrokes (any bytes) to the terminal.
func (p *PTY) Write(b []byte) (int, error) {
	if err := p.conn.Write(p.ctx, websocket.MessageBinary, b); err != nil {
		return 0, fmt.Errorf("wb: pty: %w", err)
	}
	return len(b), nil
}

// Resize sets the terminal's size (1–1000 each way).
func (p *PTY) Resize(ctx context.Context, cols, rows int) error {
	if cols < 1 || cols > 1000 || rows < 1 || rows > 1000 {
		return fmt.Errorf("wb: pty resize: cols and rows must be 1–1000, got %d×%d", cols, rows)
	}
	b, _ := json.Marshal(ptyMessage{Type: "resize", Cols: cols, Rows: rows})
	if err := p.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("wb: pty resize: %w", err)
	}
	return nil
}

// ExitCode answers the process's exit code once Read has answered io.EOF after it exited;
// false before that, or when the terminal closed without one.
func (p *PTY) ExitCode() (int, bool) {
	p.exitMu.Lock()
	defer p.exitMu.Unlock()
	if p.exitCode == nil {
		return 0, false
	}
	return *p.exitCode, true
}

// Close ends the terminal (the session goes on). A terminal whose process already exited is
// closed already: Close answers nil then too.
func (p *PTY) Close() error {
	defer p.cancel()
	_ = p.conn.Close(websocket.StatusNormalClosure, "")
	return nil
}
