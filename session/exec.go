package session

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Exec limits.
const (
	ExecTimeoutDefaultS = 60
	ExecTimeoutMaxS     = 3600
	MaxStdinBytes       = 1 << 20
)

// ExecRequest runs one command in a guest: a string run by /bin/sh -c, or an argv array.
type ExecRequest struct {
	Command  json.RawMessage   `json:"command"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	Stdin    string            `json:"stdin,omitempty"`
	TimeoutS *int              `json:"timeout_s,omitempty"`
}

// Argv returns the command as an argv, wrapping a string in /bin/sh -c, after checking every
// field.
func (r *ExecRequest) Argv() ([]string, error) {
	if len(r.Command) == 0 || string(r.Command) == "null" {
		return nil, &FieldError{Field: "command", Message: "is required: a string for /bin/sh -c, or an argv array"}
	}
	var argv []string
	var str string
	if err := json.Unmarshal(r.Command, &str); err == nil {
		if str == "" {
			return nil, &FieldError{Field: "command", Message: "is empty"}
		}
		argv = []string{"/bin/sh", "-c", str}
	} else if err := json.Unmarshal(r.Command, &argv); err != nil || len(argv) == 0 || argv[0] == "" {
		return nil, &FieldError{Field: "command", Message: "must be a non-empty string or an array of strings"}
	}
	if r.TimeoutS != nil && (*r.TimeoutS < 1 || *r.TimeoutS > ExecTimeoutMaxS) {
		return nil, &FieldError{Field: "timeout_s", Message: fmt.Sprintf("must be 1–%d seconds, got %d", ExecTimeoutMaxS, *r.TimeoutS)}
	}
	if len(r.Stdin) > MaxStdinBytes {
		return nil, &FieldError{Field: "stdin", Message: fmt.Sprintf("at most %d bytes", MaxStdinBytes)}
	}
	return argv, nil
}

// Timeout is the request's timeout in seconds, or the default.
func (r *ExecRequest) Timeout() int {
	if r.TimeoutS == nil {
		return ExecTimeoutDefaultS
	}
	return *r.TimeoutS
}

// ExecResult is the outcome of one exec.
type ExecResult struct {
	ExitCode   int    `json:"exit_code"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMs int64  `json:"duration_ms"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	// Truncated: the command wrote more than the buffered result keeps (DefaultMaxOutputBytes
	// per stream unless configured); StdoutBytes and StderrBytes count everything it wrote.
	Truncated   bool  `json:"truncated"`
	StdoutBytes int64 `json:"stdout_bytes"`
	StderrBytes int64 `json:"stderr_bytes"`
}

// ExecChunk is one line of a streamed exec (Accept: application/x-ndjson).
type ExecChunk struct {
	Stream string `json:"stream"` // stdout | stderr
	Data   string `json:"data"`
	// Encoding is "base64" when Data is base64 of bytes that are not valid UTF-8.
	Encoding string `json:"encoding,omitempty"`
}

// Wire returns the chunk as it goes on the wire: raw bytes that are not valid UTF-8 are
// base64-encoded, so that JSON carries them without loss.
func (c ExecChunk) Wire() ExecChunk {
	if c.Encoding == "" && !utf8.ValidString(c.Data) {
		return ExecChunk{Stream: c.Stream, Data: base64.StdEncoding.EncodeToString([]byte(c.Data)), Encoding: "base64"}
	}
	return c
}
