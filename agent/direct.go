package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"wb/session"
)

// A direct guest runs one exec without an agent: its init is a runtime's loader (a tier-1
// run's interpreter, started ahead of its code), and the host holds its standard streams.
// Its stdin is a Unix socket: the loader says it is ready on it, reads the exec's frame and
// then the exec's stdin from it, and writes the exec's exit status to it as it ends; stdout
// and stderr are pipes. Under gVisor an agent's start and its part of an exec were about a
// third of a tier-1 run's CPU; a direct guest pays neither. It cannot do anything else (no
// second exec, files, PTY or quiesce): the node gives direct guests to tier-1 runs only.
//
// Frame (on stdin, after an 8-byte big-endian length): the mode ('r': run the code in the
// loader's interpreter; 'x': start argv in a child, for an environment the interpreter reads
// as it starts), NUL, the working directory, each environment entry after a NUL, two NULs,
// then the code ('r') or argv NUL-separated ('x'). Status: "x" and the exit code in decimal,
// then a newline, the last thing the loader writes.

// DirectGuest is the host's side of a direct guest's standard streams.
type DirectGuest struct {
	ctrl       *net.UnixConn // the host's end of the guest's stdin
	outR, errR *os.File
	guest      [3]*os.File // the guest's ends, until ReleaseGuestStdio
	root       string      // the exec's working directory's root (the agent's --root)
	env        []string    // the guest's own environment (an agent's, for an exec through one)
	kill       func()      // ends the guest (its exec's timeout, its caller gone)
	mu         sync.Mutex
	used       bool
	closed     bool // Close was called: an exec it ended has no exit code
}

// DirectNoStatus is the exit code of a direct guest's exec whose loader ended without saying
// its status (a signal, or the guest killed): what a shell says of a SIGKILL.
const DirectNoStatus = 128 + 9

const (
	// directStatusMax bounds what the host keeps of a direct guest's stdin traffic after its
	// frame (the status is its last line; a guest's process may write there too).
	directStatusMax = 64
	// directCtrlMax bounds what the host reads of it at all: the loader writes one status
	// line, and a guest that writes on and on there would have the host read it for the
	// exec's whole timeout. Past it the guest is ended, its exec with no exit code.
	directCtrlMax = 4 << 10
	// directKillGrace is how long an exec waits, once it ended its guest (its timeout, its
	// caller gone, directCtrlMax), for the guest's streams to end before it lets go of them:
	// a stop that failed must not hold the exec for the rest of the session.
	directKillGrace = 10 * time.Second
)

// NewDirectGuest makes the streams of a direct guest: GuestStdio gives the runtime the
// guest's ends. root is its exec's working directory's root, env the guest's environment,
// kill what ends the guest.
func NewDirectGuest(root string, env []string, kill func()) (*DirectGuest, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socketpair", err)
	}
	hostEnd := os.NewFile(uintptr(fds[0]), "direct-ctrl")
	c, err := net.FileConn(hostEnd) // a dup, non-blocking, in Go's poller
	_ = hostEnd.Close()
	if err != nil {
		_ = syscall.Close(fds[1])
		return nil, fmt.Errorf("direct guest: %w", err)
	}
	d := &DirectGuest{ctrl: c.(*net.UnixConn), root: root, env: env, kill: kill}
	d.guest[0] = os.NewFile(uintptr(fds[1]), "direct-stdin") // blocking: the guest reads it
	// The guest's ends of its output pipes stay blocking: a guest writing a full non-blocking
	// pipe would fail its write (outputPipe).
	if d.outR, d.guest[1], err = outputPipe(); err == nil {
		d.errR, d.guest[2], err = outputPipe()
	}
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("direct guest: %w", err)
	}
	return d, nil
}

// GuestStdio answers the guest's stdin, stdout and stderr, for the runtime's start.
func (d *DirectGuest) GuestStdio() [3]*os.File { return d.guest }

// ReleaseGuestStdio closes the host's copies of the guest's ends, once the runtime holds them:
// the output pipes then end when the guest's processes do.
func (d *DirectGuest) ReleaseGuestStdio() {
	for i, f := range d.guest {
		if f != nil {
			_ = f.Close()
			d.guest[i] = nil
		}
	}
}

// WaitReady waits until the loader says it is ready. A loader that ended first is an error
// naming what it wrote on stderr (what was there, up to 4 KiB).
func (d *DirectGuest) WaitReady(ctx context.Context) error {
	var mu sync.Mutex
	read := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !read { // once the read is over, a deadline set now would outlive it
			_ = d.ctrl.SetReadDeadline(time.Now())
		}
	})
	var b [1]byte
	_, err := io.ReadFull(d.ctrl, b[:])
	stop()
	mu.Lock()
	read = true
	mu.Unlock()
	_ = d.ctrl.SetReadDeadline(time.Time{})
	switch {
	case err == nil && b[0] == 'r':
		return nil
	case err == nil:
		return fmt.Errorf("direct guest: the loader said %q, not that it is ready", b[:])
	case ctx.Err() != nil:
		return fmt.Errorf("direct guest: the loader was not ready: %w", context.Cause(ctx))
	}
	return fmt.Errorf("direct guest: the loader ended before it was ready; its stderr: %q", tail(d.errR))
}

// Alive reports whether the loader still waits (its stdin is open): a guest that died
// while it waited in a pool must not be claimed.
func (d *DirectGuest) Alive() bool {
	rc, err := d.ctrl.SyscallConn()
	if err != nil {
		return false
	}
	var n int
	var rerr error
	if err := rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, rerr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil {
		return false
	}
	// Nothing more is said before a frame: nothing to read is a loader that waits; a byte or
	// an end is not.
	return n <= 0 && rerr == syscall.EAGAIN
}

// Used reports whether the guest's exec has begun.
func (d *DirectGuest) Used() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// ErrDirectUsed: the direct guest ran its exec already.
var ErrDirectUsed = errors.New("the guest runs one tier-1 run's code, and ran it already")

// Exec runs req, which must be argv plus the code, in the guest once: mode 'r' in the
// loader's interpreter, or, with fork, argv started in a child (an environment the
// interpreter reads as it starts). maxOutput bounds each stream of a buffered result (out
// nil). Its result is the agent's for the same exec.
func (d *DirectGuest) Exec(ctx context.Context, req ExecRequest, fork bool, maxOutput int, out func(session.ExecChunk) error) (session.ExecResult, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return session.ExecResult{}, fmt.Errorf("direct guest: exec: %w", err)
	}
	var buffered *session.OutputBuffer
	if out == nil {
		buffered = session.NewOutputBuffer(maxOutput)
		out = buffered.Add
	}
	var outErr error
	emit := func(stream string, data []byte) error {
		err := out(session.ExecChunk{Stream: stream, Data: string(data)})
		if err != nil && outErr == nil {
			outErr = err
		}
		return err
	}
	line, gone, err := d.run(ctx, body, fork, emit)
	switch {
	case err != nil:
		return session.ExecResult{}, err
	case gone && outErr != nil:
		return session.ExecResult{}, fmt.Errorf("direct guest: exec: its output could not be passed on: %w", outErr)
	case gone:
		return session.ExecResult{}, fmt.Errorf("direct guest: exec: %w", context.Cause(ctx))
	}
	res := session.ExecResult{ExitCode: line.ExitCode, DurationMs: line.DurationMs, TimedOut: line.TimedOut}
	if buffered != nil {
		buffered.Fill(&res)
	}
	return res, nil
}

// ServeExec answers POST /v1/exec, body (an ExecRequest) for the guest, as its agent would
// (lines of output, then the result line): for a node's API, whose callers speak to agents.
// beforeResult runs once the exec has ended, before its result line goes out.
func (d *DirectGuest) ServeExec(w http.ResponseWriter, r *http.Request, body []byte, fork bool, beforeResult func()) {
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	started := false
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusOK)
		}
	}
	emit := func(stream string, data []byte) error {
		start()
		if err := enc.Encode(newChunkLine(stream, data)); err != nil {
			return err
		}
		return rc.Flush()
	}
	line, gone, err := d.run(r.Context(), body, fork, emit)
	var apiErr *Error
	switch {
	case errors.As(err, &apiErr):
		writeAPIError(w, apiErr)
	case err != nil:
		writeError(w, http.StatusConflict, "conflict", err.Error(), "")
	case !gone:
		beforeResult()
		start()
		_ = enc.Encode(line)
	}
}

// run is Exec's and ServeExec's work on an ExecRequest's body, whose output goes to emit.
func (d *DirectGuest) run(ctx context.Context, body []byte, fork bool, emit func(stream string, data []byte) error) (resultLine, bool, error) {
	start := time.Now()
	spec, apiErr := decodeExecRequest(body, d.root)
	if apiErr != nil {
		return resultLine{}, false, apiErr
	}
	if !fork && len(spec.argv) < 2 {
		return resultLine{}, false, badRequest("argv", "a direct guest's exec is its runtime's argv and the code")
	}
	d.mu.Lock()
	used := d.used
	d.used = true
	d.mu.Unlock()
	if used {
		return resultLine{}, false, ErrDirectUsed
	}
	var req ExecRequest
	_ = json.Unmarshal(body, &req) // decodeExecRequest read it whole
	spec.env = mergeEnv(d.env, req.Env)
	var frame bytes.Buffer
	frame.Write(make([]byte, 8))
	if fork {
		frame.WriteString("x\x00")
		frame.Write(runnerFrame(spec.dir, spec.env, ""))
		for i, a := range spec.argv {
			if i > 0 {
				frame.WriteByte(0)
			}
			frame.WriteString(a)
		}
	} else {
		frame.WriteString("r\x00")
		frame.Write(runnerFrame(spec.dir, spec.env, spec.argv[len(spec.argv)-1]))
	}
	b := frame.Bytes()
	binary.BigEndian.PutUint64(b[:8], uint64(len(b)-8))
	go func() {
		// Blocks while the guest reads nothing; the exec's end closes the socket.
		if _, err := d.ctrl.Write(b); err == nil && len(spec.stdin) > 0 {
			_, _ = d.ctrl.Write(spec.stdin)
		}
		_ = d.ctrl.CloseWrite()
	}()
	// Once it ended the guest, the exec waits directKillGrace at most for the guest's
	// streams to end, then lets go of its stdin, which ends the status's read.
	var letGo sync.Once
	ended := func() {
		d.kill()
		letGo.Do(func() { time.AfterFunc(directKillGrace, func() { _ = d.ctrl.Close() }) })
	}
	waited := make(chan struct{})
	code := DirectNoStatus
	go func() {
		defer close(waited)
		var over bool
		if code, over = readStatus(d.ctrl); over {
			ended()
		}
	}()
	line, gone := streamOutput(ctx, d.outR, d.errR, waited, func() int { return code }, ended, spec.timeout, start, emit)
	_ = d.ctrl.Close()
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed && !gone {
		return resultLine{}, false, errors.New("direct guest: exec: the guest's streams were closed under it (its session ended)")
	}
	return line, gone, nil
}

// readStatus reads r to its end and answers the exit code of its last line, "x" and a
// decimal code; DirectNoStatus when it ends otherwise. It keeps directStatusMax bytes, and
// reads directCtrlMax at most: over says it stopped there.
func readStatus(r io.Reader) (code int, over bool) {
	var last []byte
	buf := make([]byte, 512)
	total := 0
	for {
		n, err := r.Read(buf)
		total += n
		last = append(last, buf[:n]...)
		if len(last) > directStatusMax {
			last = append(last[:0], last[len(last)-directStatusMax:]...)
		}
		if total > directCtrlMax {
			return DirectNoStatus, true
		}
		if err != nil {
			break
		}
	}
	s, ok := bytes.CutSuffix(last, []byte("\n"))
	if !ok {
		return DirectNoStatus, false
	}
	if i := bytes.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	digits, ok := bytes.CutPrefix(s, []byte("x"))
	c, err := strconv.Atoi(string(digits))
	if !ok || err != nil || c < 0 || c > 255 {
		return DirectNoStatus, false
	}
	return c, false
}

// Close closes the host's ends (and the guest's, if still held).
func (d *DirectGuest) Close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.ReleaseGuestStdio()
	if d.ctrl != nil {
		_ = d.ctrl.Close()
	}
	for _, f := range []*os.File{d.outR, d.errR} {
		if f != nil {
			_ = f.Close()
		}
	}
}
