package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"wb/session"
)

// clientBase is the URL base of requests to the agent; the host is ignored (the transport
// dials the socket).
const clientBase = "http://agent"

// Client talks to one agent over its Unix socket. It is safe for concurrent use.
type Client struct {
	hc     *http.Client
	socket string
	base   string // URL base of every request
	token  string // bearer token sent with every request, if set
	// proxied: the client reaches the agent through a proxy (the node's), which alone may
	// end an exec's answer with an error line (BrokenLine); from the agent itself such a
	// line is a forgery.
	proxied bool
	// MaxOutputBytes caps each stream of a buffered Exec (nil out); 0 means
	// session.DefaultMaxOutputBytes. Set it before the first Exec.
	MaxOutputBytes int
	// CheckPTY, when set, sees the command of every PTY before the agent does, and its error
	// refuses the PTY: a node's runtime decision point, for a client it hands out in process
	// (over HTTP, the node's proxy checks).
	CheckPTY func(ctx context.Context, command string) error
	// Refusal, when set, turns each error answer of the agent (the *Error of its status and
	// body, for any call and a PTY's handshake) into the one the client returns: a node's
	// client of a guest's agent, which the guest may replace, for a caller in process, so
	// that no answer of the agent's passes for a refusal of the node's (the node's proxy
	// does the same for callers over HTTP).
	Refusal func(*Error) *Error
	// Answered, when set, is told of each request the client makes of the agent (a PTY's
	// handshake included), by method and path, with the status the client answered it
	// with: the answer's (101 for a PTY upgraded), that of the *Error it returns (after
	// Refusal, or CheckPTY's), or 502 for an agent that gave no answer the client takes: a
	// node's metrics of the calls to its guests' agents, for a client it hands out in
	// process. It is called before the answer's body is read.
	Answered func(method, path string, status int)
}

// NewClient returns a client of the agent listening on socketPath. Requests have no timeout of
// their own: bound them with their contexts.
func NewClient(socketPath string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return DialSocket(ctx, socketPath)
		},
		MaxIdleConns:        8,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		// The agent is the guest's: Go's default would let it make the node hold 10 MiB of
		// headers for every answer.
		MaxResponseHeaderBytes: MaxAnswerHeaderBytes,
	}
	return &Client{hc: &http.Client{Transport: tr, CheckRedirect: noRedirect}, socket: socketPath, base: clientBase}
}

// NewDialClient returns a client of an agent reached through dial (a VM's agent over hybrid
// vsock, say). Requests have no timeout of their own: bound them with their contexts.
func NewDialClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConns:        8,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		// The agent is the guest's: Go's default would let it make the node hold 10 MiB of
		// headers for every answer.
		MaxResponseHeaderBytes: MaxAnswerHeaderBytes,
	}
	return &Client{hc: &http.Client{Transport: tr, CheckRedirect: noRedirect}, base: clientBase}
}

// NewHTTPClient returns a client of an agent reached over HTTP through a proxy (the node's
// /v1/sessions/{id}/agent), at base, sending token as a bearer token. hc may be shared.
func NewHTTPClient(hc *http.Client, base, token string) *Client {
	own := *hc // its transport shared, its redirect policy the client's own
	own.CheckRedirect = noRedirect
	return &Client{hc: &own, base: strings.TrimRight(base, "/"), token: token, proxied: true}
}

// Socket is the socket path the client dials.
func (c *Client) Socket() string { return c.socket }

// Close closes the client's idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

func (c *Client) do(ctx context.Context, method, path string, q url.Values, body io.Reader, contentType string) (resp *http.Response, err error) {
	if c.Answered != nil {
		defer func() { c.Answered(method, path, answeredStatus(resp, err)) }()
	}
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("agent: %s %s: %w", method, path, err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err = c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent: %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		_ = resp.Body.Close()
		return nil, redirected(resp)
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" || resp.Uncompressed {
		// The agent encodes none of its answers, and a node passes none on: one that reaches
		// the client (from a node from before it refused them) went past the node's checks.
		_ = resp.Body.Close()
		if resp.Uncompressed { // the transport decoded it, and dropped the header
			ce = "gzip"
		}
		return nil, &Error{Status: http.StatusBadGateway, Code: "guest_error",
			Message: fmt.Sprintf("agent: the guest's agent answered %d encoded (%.64s), which is not read", resp.StatusCode, ce)}
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, c.refusal(readError(resp))
	}
	return resp, nil
}

// noRedirect is the redirect policy of every client: none is followed (see redirected), on
// an http.Client of the caller's (NewHTTPClient) too, and in a PTY's handshake, whose policy
// coder/websocket calls.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// redirected is the error of an answer that is a redirect (3xx). The agent sends none, and a
// guest may replace its agent: a redirect followed would take the request, the token with it,
// to another session's agent or any other URL. One that reaches the client (passed on by a
// node from before the node refused them) is the guest's error, its body unread.
func redirected(resp *http.Response) *Error {
	return &Error{Status: http.StatusBadGateway, Code: "guest_error",
		Message: fmt.Sprintf("agent: the guest's agent answered %d, a redirect, which is not followed", resp.StatusCode)}
}

// answeredStatus is the status of a call the client answered resp or err (see Answered).
func answeredStatus(resp *http.Response, err error) int {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Status
	case err != nil:
		return http.StatusBadGateway
	}
	return resp.StatusCode
}

// refusal is e as the client returns it (see Refusal).
func (c *Client) refusal(e *Error) *Error {
	if c.Refusal != nil {
		if r := c.Refusal(e); r != nil {
			return r
		}
	}
	return e
}

// readError turns an error answer into an *Error.
func readError(resp *http.Response) *Error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var env struct {
		Error *Error `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err == nil && env.Error != nil && env.Error.Code != "" {
		env.Error.Status = resp.StatusCode
		return env.Error
	}
	return &Error{Status: resp.StatusCode, Code: "http_error", Message: strings.TrimSpace(resp.Status + " " + string(b))}
}

func (c *Client) getJSON(ctx context.Context, path string, q url.Values, v any) error {
	resp, err := c.do(ctx, http.MethodGet, path, q, nil, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(boundAnswer(resp.Body)).Decode(v); err != nil {
		return fmt.Errorf("agent: GET %s: decode answer: %w", path, err)
	}
	return nil
}

// Health checks that the agent answers.
func (c *Client) Health(ctx context.Context) error {
	var h struct {
		OK  bool `json:"ok"`
		PID int  `json:"pid"`
	}
	if err := c.getJSON(ctx, "/v1/health", nil, &h); err != nil {
		return err
	}
	if !h.OK {
		return errors.New("agent: health: not ok")
	}
	return nil
}

// Exec runs req and passes each output chunk to out as it arrives (Data holds the raw bytes).
// With a nil out, the output is collected into the result's Stdout and Stderr instead, at most
// MaxOutputBytes of each (the rest is read, counted and dropped: see ExecResult.Truncated). An error
// from out stops the exec (the agent kills it) and is returned. Cancelling ctx kills it too.
// A command that cannot start is a result with exit code 127 (not found) or 126, not an error.
func (c *Client) Exec(ctx context.Context, req ExecRequest, out func(session.ExecChunk) error) (session.ExecResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return session.ExecResult{}, fmt.Errorf("agent: exec: encode request: %w", err)
	}
	// ctx ends the request until its result; then the request lives on for its answer's end
	// (see release), which it does not wait for.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	detach := context.AfterFunc(ctx, cancel)
	resp, err := c.do(rctx, http.MethodPost, "/v1/exec", nil, bytes.NewReader(body), "application/json")
	if err != nil {
		detach()
		cancel()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return session.ExecResult{}, err
	}
	released := false
	defer func() {
		if !released {
			detach()
			cancel()
			resp.Body.Close()
		}
	}()
	if resp.StatusCode != http.StatusOK {
		// The agent answers an exec 200, and a node checks the lines of such an answer alone
		// (one from before it refused the others passed them on unchecked): the lines of
		// another status are the guest's, not read.
		return session.ExecResult{}, &Error{Status: http.StatusBadGateway, Code: "guest_error",
			Message: fmt.Sprintf("agent: exec: the guest's agent answered %d, not 200", resp.StatusCode)}
	}
	var buffered *session.OutputBuffer
	if out == nil {
		buffered = session.NewOutputBuffer(c.MaxOutputBytes)
		out = buffered.Add
	}
	// One line is one value, decoded once the line is read whole: a json.Decoder on the
	// stream would hold a value spread over many short lines (whitespace between its
	// elements may be newlines), without end, before decoding it.
	lines := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := readAnswerLine(lines)
		if err != nil {
			if errors.Is(err, errTooLong) {
				return session.ExecResult{}, fmt.Errorf("agent: exec: %w", err)
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return session.ExecResult{}, fmt.Errorf("agent: exec: the answer ended without a result: %w", err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var l execLine
		if err := json.Unmarshal(line, &l); err != nil {
			return session.ExecResult{}, fmt.Errorf("agent: exec: a line of the answer is not one JSON value: %w", err)
		}
		if l.Broken != nil && !c.proxied {
			return session.ExecResult{}, errors.New("agent: exec: the agent's answer has an error line, which only a proxy in front of it sends: not passed on as one")
		}
		if l.Broken != nil {
			return session.ExecResult{}, &Error{Status: l.Broken.Status, Code: l.Broken.Code, Message: l.Broken.Message}
		}
		if l.ExitCode != nil {
			res := session.ExecResult{ExitCode: *l.ExitCode, DurationMs: l.DurationMs, TimedOut: l.TimedOut}
			if buffered != nil {
				buffered.Fill(&res)
			}
			if released = detach(); released {
				go release(resp.Body, cancel)
			}
			return res, nil
		}
		ch, err := l.chunk()
		if err != nil {
			return session.ExecResult{}, err
		}
		if err := out(ch); err != nil {
			return session.ExecResult{}, fmt.Errorf("agent: exec: output: %w", err)
		}
	}
}

// releaseWait is how long release waits for the end of an answer after its result.
const releaseWait = time.Second

// release reads what is left of a streamed answer, its result read, closes it and ends its
// request (cancel). The transport reuses a connection only once its answer was read to the
// end, before its request ended, and that end (the last, empty chunk) comes just after the
// result line: an answer closed at its result, or whose caller's request ended first, cost
// the next call a new connection (a TCP or socket dial, a server goroutine and its buffers),
// and through a gateway more than half of all execs did so. An answer that goes on is cut
// after releaseWait or 64 KiB, and its connection closed.
func release(body io.ReadCloser, cancel context.CancelFunc) {
	t := time.AfterFunc(releaseWait, cancel)
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	t.Stop()
	_ = body.Close()
	cancel()
}

// StartRunner starts a runner (see RunnerRequest) and answers its pid once it is ready; a
// loader that fails is an *Error 502 runner_failed quoting its stderr.
func (c *Client) StartRunner(ctx context.Context, req RunnerRequest) (int, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return 0, fmt.Errorf("agent: runner: encode request: %w", err)
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/runners", nil, bytes.NewReader(body), "application/json")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		PID int `json:"pid"`
	}
	if err := json.NewDecoder(boundAnswer(resp.Body)).Decode(&out); err != nil {
		return 0, fmt.Errorf("agent: POST /v1/runners: decode answer: %w", err)
	}
	return out.PID, nil
}

// Quiesce asks the agent to close its listener and every connection for d (1 ms – 60 s) and
// then listen again. When it returns nil, the agent already holds no socket of the host's.
func (c *Client) Quiesce(ctx context.Context, d time.Duration) error {
	return c.QuiesceUntil(ctx, d, "")
}

// QuiesceUntil is Quiesce that also ends when the file resumeFile (a plain name) appears in
// the directory of the agent's socket, at most most after it began: the host creates the
// file when it is done, so the agent is off no longer than the host needs.
func (c *Client) QuiesceUntil(ctx context.Context, most time.Duration, resumeFile string) error {
	body, _ := json.Marshal(quiesceRequest{ForMs: most.Milliseconds(), ResumeFile: resumeFile})
	resp, err := c.do(ctx, http.MethodPost, "/v1/quiesce", nil, bytes.NewReader(body), "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// The answer's body ends when the agent closes the connection: reading it to its end is
	// what tells that the agent has let go of every socket.
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return fmt.Errorf("agent: quiesce: read answer: %w", err)
	}
	c.hc.CloseIdleConnections()
	var answer struct {
		Released bool `json:"released"`
	}
	if json.Unmarshal(raw, &answer) != nil || !answer.Released {
		// An older agent (a guest started before the node's upgrade) answered before its
		// egress relay let go of its TCP listener, which a checkpoint cannot save; a runsc
		// process's start used to give it the time. It gets that time here.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(olderAgentSettle):
		}
	}
	return nil
}

// olderAgentSettle is how long QuiesceUntil waits after an older agent's answer, which came
// before its egress relay had closed: about what a runsc checkpoint process took to start on
// a loaded host.
const olderAgentSettle = 100 * time.Millisecond

// OpenFile streams the file at path (relative paths are relative to the agent's root).
func (c *Client) OpenFile(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/files", url.Values{"path": {path}}, nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ReadFile reads the file at path, at most MaxFileBytes of it (an error beyond).
func (c *Client) ReadFile(ctx context.Context, path string) ([]byte, error) {
	rc, err := c.OpenFile(ctx, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("agent: read %s: %w", path, err)
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("agent: read %s: larger than %d bytes", path, MaxFileBytes)
	}
	return b, nil
}

// WriteFile replaces the file at path with data, atomically, creating its parents. A mode of
// 0 keeps the replaced file's permissions (0644 for a new file).
func (c *Client) WriteFile(ctx context.Context, path string, data io.Reader, mode fs.FileMode) error {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", "0"+strconv.FormatUint(uint64(mode.Perm()), 8))
	}
	resp, err := c.do(ctx, http.MethodPut, "/v1/files", q, data, "application/octet-stream")
	if err != nil {
		return err
	}
	// The answer is a line of JSON, read to its end so that the connection is reused; the
	// agent is the guest's, and one that sends more does not hold the write.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.Body.Close()
}

// DeleteFile removes the file or empty directory at path.
func (c *Client) DeleteFile(ctx context.Context, path string) error {
	resp, err := c.do(ctx, http.MethodDelete, "/v1/files", url.Values{"path": {path}}, nil, "")
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// ListDir lists the directory at path: at most maxListEntries entries, else a 413 Error.
func (c *Client) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/files", url.Values{"path": {path}, "list": {"1"}}, nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := decodeListing(boundAnswer(resp.Body))
	var ae *Error
	if err != nil && !errors.As(err, &ae) {
		return nil, fmt.Errorf("agent: GET /v1/files: decode answer: %w", err)
	}
	return out, err
}

// decodeListing decodes a listing's JSON array one entry at a time, so that the entries,
// not the answer's bytes, bound what it holds.
func decodeListing(r io.Reader) ([]FileInfo, error) {
	dec := json.NewDecoder(r)
	tok, err := dec.Token()
	if err != nil || tok == nil { // null: no listing, as Decode has it
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("want a JSON array, got %v", tok)
	}
	out := []FileInfo{}
	for dec.More() {
		if len(out) == maxListEntries {
			return nil, errListTooLarge()
		}
		var fi FileInfo
		if err := dec.Decode(&fi); err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	if _, err := dec.Token(); err != nil { // the closing ]
		return nil, err
	}
	return out, nil
}

// errListTooLarge is a listing past maxListEntries, as the agent answers it and its client.
func errListTooLarge() *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Code: "too_large", Param: "path",
		Message: fmt.Sprintf("the directory has more than %d entries; list a narrower one", maxListEntries)}
}

// PTY opens a terminal running command (by /bin/sh -c; "" for an interactive /bin/sh) of cols ×
// rows (0 for the defaults 80 × 24). Binary messages carry terminal bytes both ways; send the
// text message {"type":"resize","cols":N,"rows":N} to resize. When the process exits the agent
// sends {"type":"exit","exit_code":N} and closes with status 1000. On a refused handshake the
// response (e.g. 400 naming the bad parameter) is returned with the error.
func (c *Client) PTY(ctx context.Context, cols, rows int, command string) (_ *websocket.Conn, resp *http.Response, err error) {
	if c.Answered != nil {
		defer func() {
			if err == nil {
				c.Answered(http.MethodGet, "/v1/pty", http.StatusSwitchingProtocols)
				return
			}
			c.Answered(http.MethodGet, "/v1/pty", answeredStatus(nil, err))
		}()
	}
	if c.CheckPTY != nil {
		if err := c.CheckPTY(ctx, command); err != nil {
			return nil, nil, fmt.Errorf("agent: pty: %w", err)
		}
	}
	q := url.Values{}
	if cols != 0 {
		q.Set("cols", strconv.Itoa(cols))
	}
	if rows != 0 {
		q.Set("rows", strconv.Itoa(rows))
	}
	if command != "" {
		q.Set("command", command)
	}
	u := "ws" + strings.TrimPrefix(c.base, "http") + "/v1/pty"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	hdr := http.Header{}
	if c.token != "" {
		hdr.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPClient:      c.hc,
		HTTPHeader:      hdr,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 && resp.StatusCode < 400 {
			return nil, resp, fmt.Errorf("agent: pty: %w", redirected(resp))
		}
		if resp != nil && resp.StatusCode >= 400 && resp.Body != nil {
			// The node or the agent refused the PTY (a policy, a bad size): say why, and leave
			// the body readable for the caller.
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body = io.NopCloser(bytes.NewReader(b))
			why := c.refusal(readError(&http.Response{StatusCode: resp.StatusCode, Status: resp.Status, Body: io.NopCloser(bytes.NewReader(b))}))
			return nil, resp, fmt.Errorf("agent: pty: %w", why)
		}
		return nil, resp, fmt.Errorf("agent: pty: %w", err)
	}
	conn.SetReadLimit(ptyReadLimit)
	return conn, resp, nil
}

// Resize sends a PTY resize message on conn.
func Resize(ctx context.Context, conn *websocket.Conn, cols, rows int) error {
	b, _ := json.Marshal(ptyMessage{Type: "resize", Cols: cols, Rows: rows})
	return conn.Write(ctx, websocket.MessageText, b)
}

// Bounds on what the client reads of an agent's answer. The agent is a guest's process, and
// a guest may put its own server in its place: each bound keeps a hostile answer from filling
// the memory of the node or the gateway that reads it.
const (
	// maxAnswerLine bounds a line of an exec's answer: the agent's longest, a 32 KiB chunk
	// whose every byte JSON escapes as \u00XX, is under 200 KiB.
	maxAnswerLine = 1 << 20
	// maxAnswerBytes bounds any other JSON answer (a health check, a runner's start, a
	// directory's listing: a hundred thousand entries fit).
	maxAnswerBytes = 16 << 20
	// maxListEntries bounds a directory's listing: bytes alone do not, as 16 MiB of "{},"
	// decode to millions of entries, gigabytes in memory. A real listing of more would pass
	// maxAnswerBytes anyway (about 160 bytes an entry), and would not be read by a person.
	maxListEntries = 100_000
)

// MaxAnswerHeaderBytes bounds the headers of an agent's answer that a client or a proxy of
// the node reads (the agent's own are a few hundred bytes).
const MaxAnswerHeaderBytes = 64 << 10

// errTooLong is the error of an answer past one of its bounds.
var errTooLong = errors.New("the agent's answer is too long")

// readAnswerLine reads the next line of an answer, its newline included (the last line may
// lack one), failing at a line longer than maxAnswerLine; io.EOF once nothing is left.
func readAnswerLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		part, err := r.ReadSlice('\n')
		if len(line)+len(part) > maxAnswerLine {
			return nil, fmt.Errorf("%w: a line longer than %d bytes", errTooLong, maxAnswerLine)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			line = append(line, part...)
			continue
		}
		if line == nil {
			// part is the reader's buffer, which the next read overwrites.
			line = append([]byte(nil), part...)
		} else {
			line = append(line, part...)
		}
		if err != nil && (len(line) == 0 || !errors.Is(err, io.EOF)) {
			return nil, err
		}
		return line, nil
	}
}

// boundAnswer reads r, failing past maxAnswerBytes.
func boundAnswer(r io.Reader) io.Reader { return &boundedReader{r: r, max: maxAnswerBytes} }

// boundedReader fails once it has read more than max bytes in all.
type boundedReader struct {
	r   io.Reader
	max int
	n   int // bytes read
}

func (b *boundedReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.n += n; b.n > b.max {
		return n, fmt.Errorf("%w: an answer longer than %d bytes", errTooLong, b.max)
	}
	return n, err
}
