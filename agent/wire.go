package agent

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"wb/session"
)

// The wire format of the agent's API, shared by the server and Client.

// ExecRequest is the body of POST /v1/exec.
type ExecRequest struct {
	// Argv is the command; Argv[0] is looked up in the command's PATH unless it contains a slash.
	Argv []string `json:"argv"`
	// Env is added to (and overrides) the agent's environment, with PATH, HOME and LANG defaulted.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the working directory; relative to Config.Root; default Config.Root.
	Cwd string `json:"cwd,omitempty"`
	// Stdin is the command's standard input (base64 in JSON); empty means /dev/null.
	Stdin []byte `json:"stdin,omitempty"`
	// TimeoutS is the timeout in seconds: 0 means session.ExecTimeoutDefaultS; at most
	// session.ExecTimeoutMaxS.
	TimeoutS int `json:"timeout_s"`
	// Runner names a runner started beforehand (POST /v1/runners) to run the command in, when
	// one of that name waits and Argv is its Argv plus one argument (the code): the code goes
	// to the waiting process instead of a new one starting. Without such a runner (none was
	// started, it was used, it died) the command runs as usual. A runner serves one exec.
	Runner string `json:"runner,omitempty"`
}

// RunnerRequest is the body of POST /v1/runners: start Argv plus Loader, a program that
// writes one byte on fd 4 once it is ready, then reads one exec's input from fd 3 until EOF
// (see Runner's frame) and runs it as Argv plus the code would. The agent answers once the
// byte came, or with an error (the loader's stderr in its message) when it exited first or
// stayed silent for ReadyTimeoutS (default 30).
type RunnerRequest struct {
	Name          string   `json:"name"`
	Argv          []string `json:"argv"`
	Loader        string   `json:"loader"`
	ReadyTimeoutS int      `json:"ready_timeout_s,omitempty"`
}

// ExecRequestFrom turns the public API's exec request into the agent's, after validating it.
func ExecRequestFrom(r *session.ExecRequest) (ExecRequest, error) {
	argv, err := r.Argv()
	if err != nil {
		return ExecRequest{}, err
	}
	return ExecRequest{Argv: argv, Env: r.Env, Cwd: r.Cwd, Stdin: []byte(r.Stdin), TimeoutS: r.Timeout()}, nil
}

// execLine is one line of the application/x-ndjson answer to POST /v1/exec: an output chunk
// {"stream","data"[,"encoding":"base64"]} or, last, the result {"exit_code","duration_ms","timed_out"}.
type execLine struct {
	Stream   string `json:"stream,omitempty"`
	Data     string `json:"data,omitempty"`
	Encoding string `json:"encoding,omitempty"`

	ExitCode   *int  `json:"exit_code,omitempty"`
	DurationMs int64 `json:"duration_ms,omitempty"`
	TimedOut   bool  `json:"timed_out,omitempty"`

	Broken *BrokenLine `json:"error,omitempty"` // a proxy's reason the answer broke off
}

// ProxyLine reports whether line, a line of an exec's answer, reads as a proxy's BrokenLine
// (as Client reads it: any spelling of the key a JSON decoder takes for "error"). A proxy in
// front of a guest's agent, which the guest may replace, refuses such a line from the agent,
// whose answer would otherwise carry a refusal that the proxy never made.
func ProxyLine(line []byte) bool {
	var l struct {
		Broken *BrokenLine `json:"error"`
	}
	_ = json.Unmarshal(line, &l) // a line that is not one value fails the client's read anyway
	return l.Broken != nil
}

// ResultLine reports whether line, a line of an exec's answer, reads as its result (as
// Client reads it: any spelling of the key a JSON decoder takes for "exit_code"). A proxy
// that acts before its caller learns the result (the node's OOM check) finds the result so,
// not by its bytes, which a guest's agent may spell otherwise.
func ResultLine(line []byte) bool {
	var l execLine
	_ = json.Unmarshal(line, &l) // a field of the wrong type fails the client's read; the result's key counts
	return l.ExitCode != nil
}

// MaxExecLine bounds a line of an exec's answer, as Client reads it.
const MaxExecLine = maxAnswerLine

// BrokenLine is the last line that a proxy in front of the agent (the node's) may add to an
// exec answer that broke off, with the reason it knows: {"error":{"status","code","message"}}.
// The client answers it as an *Error of that status and code.
type BrokenLine struct {
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// chunkLine is an output line. Data is the bytes as a JSON string when they are valid UTF-8
// (the agent never splits a UTF-8 sequence across chunks), else base64 with encoding "base64".
type chunkLine struct {
	Stream   string `json:"stream"`
	Data     string `json:"data"`
	Encoding string `json:"encoding,omitempty"`
}

func newChunkLine(stream string, data []byte) chunkLine {
	if utf8.Valid(data) {
		return chunkLine{Stream: stream, Data: string(data)}
	}
	return chunkLine{Stream: stream, Data: base64.StdEncoding.EncodeToString(data), Encoding: "base64"}
}

// resultLine is the last line of an exec answer.
type resultLine struct {
	ExitCode   int   `json:"exit_code"`
	DurationMs int64 `json:"duration_ms"`
	TimedOut   bool  `json:"timed_out"`
}

// chunk decodes an output line into a session.ExecChunk whose Data holds the raw bytes.
func (l *execLine) chunk() (session.ExecChunk, error) {
	switch l.Stream {
	case "stdout", "stderr":
	default:
		return session.ExecChunk{}, fmt.Errorf("agent: exec answer: unknown stream %q", l.Stream)
	}
	switch l.Encoding {
	case "":
		return session.ExecChunk{Stream: l.Stream, Data: l.Data}, nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(l.Data)
		if err != nil {
			return session.ExecChunk{}, fmt.Errorf("agent: exec answer: bad base64 data: %w", err)
		}
		return session.ExecChunk{Stream: l.Stream, Data: string(b)}, nil
	default:
		return session.ExecChunk{}, fmt.Errorf("agent: exec answer: unknown encoding %q", l.Encoding)
	}
}

// FileInfo is one entry of GET /v1/files?list=1.
type FileInfo struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
	// Mode is the permission bits in octal, e.g. "0644" (setuid, setgid and sticky included).
	Mode      string    `json:"mode"`
	IsDir     bool      `json:"is_dir"`
	IsSymlink bool      `json:"is_symlink,omitempty"`
	ModTime   time.Time `json:"mod_time"`
}

// ptyMessage is a PTY text frame from the client: {"type":"resize","cols":N,"rows":N}.
// The agent sends {"type":"exit","exit_code":N} before it closes a PTY whose process ended.
type ptyMessage struct {
	Type     string `json:"type"`
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
}

// Error is an error answer of the agent, {"error":{"code","message","param"}} with the HTTP
// status; Client methods return it (as *Error) for every answer that is not a success.
type Error struct {
	Status  int    `json:"-"` // HTTP status
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("agent: %d %s", e.Status, e.Code)
	if e.Param != "" {
		msg += " (" + e.Param + ")"
	}
	return msg + ": " + e.Message
}
