package client

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"strings"
	"time"
)

// Exec runs a command in a running session and answers its buffered result (each stream kept
// up to 8 MiB; past that Truncated, with the full byte counts). A non-zero exit is not an
// error. ExecStream does not truncate.
func (c *Client) Exec(ctx context.Context, sessionID string, req ExecRequest) (*ExecResult, error) {
	var r ExecResult
	return &r, c.do(ctx, http.MethodPost, "/v1/sessions/"+pathID(sessionID)+"/exec", nil, req, &r)
}

// ExecEvent is one line of a streamed exec: output (Stream and Data), or, last, the end of the
// command (End).
type ExecEvent struct {
	Stream string // "stdout" or "stderr"; empty on the end event
	Data   []byte // the output's raw bytes (base64 on the wire already decoded)
	End    *ExecEnd
}

// ExecStream runs a command and yields its output as it comes, then one event with End set.
// A failure before or during the stream is yielded as the error (an *Error when the API said
// it, also mid-stream), after which the sequence ends; a stream cut before its end line is
// io.ErrUnexpectedEOF. Stopping the loop early closes the connection.
func (c *Client) ExecStream(ctx context.Context, sessionID string, req ExecRequest) iter.Seq2[ExecEvent, error] {
	return func(yield func(ExecEvent, error) bool) {
		body, err := json.Marshal(req)
		if err != nil {
			yield(ExecEvent{}, fmt.Errorf("wb: encode the exec request: %w", err))
			return
		}
		path := "/v1/sessions/" + pathID(sessionID) + "/exec"
		resp, err := c.send(ctx, request{method: http.MethodPost, path: path, body: body, accept: "application/x-ndjson"})
		if err != nil {
			yield(ExecEvent{}, err)
			return
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-ndjson") {
			yield(ExecEvent{}, fmt.Errorf("wb: exec answered %s, not a stream (application/x-ndjson)", ct))
			return
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 64<<20) // one line is one chunk of output: bounded by the agent's reads
		for sc.Scan() {
			ev, err := parseExecLine(sc.Bytes())
			if !yield(ev, err) || err != nil || ev.End != nil {
				return
			}
		}
		err = sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		yield(ExecEvent{}, fmt.Errorf("wb: the exec stream ended before its last line: %w", err))
	}
}

// parseExecLine reads one NDJSON line: a chunk, the end, or an error.
func parseExecLine(line []byte) (ExecEvent, error) {
	var l struct {
		Stream   string `json:"stream"`
		Data     string `json:"data"`
		Encoding string `json:"encoding"`
		ExitCode *int   `json:"exit_code"`
		Duration int64  `json:"duration_ms"`
		TimedOut bool   `json:"timed_out"`
		Error    *Error `json:"error"`
	}
	if err := json.Unmarshal(line, &l); err != nil {
		return ExecEvent{}, fmt.Errorf("wb: exec stream: a line that is not JSON: %w", err)
	}
	switch {
	case l.Error != nil:
		l.Error.Status = http.StatusOK // the stream had started: the status was 200
		return ExecEvent{}, l.Error
	case l.ExitCode != nil:
		return ExecEvent{End: &ExecEnd{ExitCode: *l.ExitCode, DurationMs: l.Duration, TimedOut: l.TimedOut}}, nil
	case l.Stream != "":
		data := []byte(l.Data)
		if l.Encoding == "base64" {
			b, err := base64.StdEncoding.DecodeString(l.Data)
			if err != nil {
				return ExecEvent{}, fmt.Errorf("wb: exec stream: bad base64 chunk: %w", err)
			}
			data = b
		}
		return ExecEvent{Stream: l.Stream, Data: data}, nil
	}
	return ExecEvent{}, fmt.Errorf("wb: exec stream: a line that is neither output, end nor error: %.200s", line)
}

// ExecCollect streams a command and collects its whole output (never truncated) into a
// result.
func (c *Client) ExecCollect(ctx context.Context, sessionID string, req ExecRequest) (*ExecResult, error) {
	var out, errOut strings.Builder
	for ev, err := range c.ExecStream(ctx, sessionID, req) {
		if err != nil {
			return nil, err
		}
		switch {
		case ev.End != nil:
			return &ExecResult{ExitCode: ev.End.ExitCode, DurationMs: ev.End.DurationMs, TimedOut: ev.End.TimedOut,
				Stdout: out.String(), Stderr: errOut.String(),
				StdoutBytes: int64(out.Len()), StderrBytes: int64(errOut.Len())}, nil
		case ev.Stream == "stderr":
			errOut.Write(ev.Data)
		default:
			out.Write(ev.Data)
		}
	}
	return nil, errors.New("wb: the exec stream yielded no end") // unreachable: ExecStream ends with End or an error
}

// WaitSession polls a session until it is in one of states (or terminal, or ctx ends) and
// answers it as last seen.
func (c *Client) WaitSession(ctx context.Context, id string, states ...SessionState) (*Session, error) {
	for delay := 100 * time.Millisecond; ; delay = min(delay*2, 2*time.Second) {
		s, err := c.GetSession(ctx, id)
		if err != nil {
			return nil, err
		}
		for _, want := range states {
			if s.State == want {
				return s, nil
			}
		}
		if s.State.Terminal() {
			return s, fmt.Errorf("wb: session %s is %s, never %v", id, s.State, states)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return s, fmt.Errorf("wb: session %s still %s: %w", id, s.State, ctx.Err())
		case <-t.C:
		}
	}
}
