package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"wb/session"
)

const (
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// After the command exits, its output is read on while it keeps coming (background processes
	// that inherited the pipes): until it pauses for drainIdle, at most drainMax in all.
	drainIdle = 250 * time.Millisecond
	drainMax  = 5 * time.Second
)

// execSpec is a validated exec request.
type execSpec struct {
	argv    []string
	env     []string
	dir     string
	stdin   []byte
	timeout time.Duration
	runner  string // a pre-started runner to use if one fits (ExecRequest.Runner)
}

// decodeExecRequest parses and validates a POST /v1/exec body. Its errors are 400s naming the
// field; it never panics.
func decodeExecRequest(body []byte, root string) (execSpec, *Error) {
	var req ExecRequest
	if err := json.Unmarshal(body, &req); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			param := te.Field
			if i := strings.IndexByte(param, '.'); i >= 0 {
				param = param[:i]
			}
			return execSpec{}, badRequest(param, "%s must be %s, got JSON %s", orBody(param), jsonType(te), te.Value)
		}
		return execSpec{}, badRequest("", "the body must be a JSON object (ExecRequest): %v", err)
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return execSpec{}, badRequest("argv", "argv is required: a non-empty array of strings with a non-empty first element")
	}
	for i, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return execSpec{}, badRequest("argv", "argv[%d] contains a NUL byte", i)
		}
	}
	if req.TimeoutS < 0 || req.TimeoutS > session.ExecTimeoutMaxS {
		return execSpec{}, badRequest("timeout_s", "timeout_s must be 0 (the default, %d) or 1–%d seconds, got %d", session.ExecTimeoutDefaultS, session.ExecTimeoutMaxS, req.TimeoutS)
	}
	timeout := req.TimeoutS
	if timeout == 0 {
		timeout = session.ExecTimeoutDefaultS
	}
	if len(req.Stdin) > session.MaxStdinBytes {
		return execSpec{}, badRequest("stdin", "stdin is %d bytes; at most %d", len(req.Stdin), session.MaxStdinBytes)
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return execSpec{}, badRequest("env", "env name %q is invalid: it must be non-empty, without '=' or NUL", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return execSpec{}, badRequest("env", "env %s contains a NUL byte", k)
		}
	}
	dir, apiErr := resolvePath(root, req.Cwd, "cwd")
	if apiErr != nil {
		return execSpec{}, apiErr
	}
	return execSpec{
		argv:    req.Argv,
		env:     commandEnv(req.Env),
		dir:     dir,
		stdin:   req.Stdin,
		timeout: time.Duration(timeout) * time.Second,
		runner:  req.Runner,
	}, nil
}

// commandEnv is the environment of a command: the agent's own (the guest image's), PATH, HOME
// and LANG defaulted when empty, then extra; sorted by name.
func commandEnv(extra map[string]string) []string { return mergeEnv(os.Environ(), extra) }

// mergeEnv is commandEnv's environment from base, an agent's own (or the guest's, for a
// direct guest's exec, which has no agent).
func mergeEnv(base []string, extra map[string]string) []string {
	env := map[string]string{}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	for k, v := range map[string]string{"PATH": defaultPath, "HOME": "/root", "LANG": "C.UTF-8"} {
		if env[k] == "" {
			env[k] = v
		}
	}
	maps.Copy(env, extra)
	keys := slices.Sorted(maps.Keys(env))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

func orBody(param string) string {
	if param == "" {
		return "the body"
	}
	return param
}

func jsonType(te *json.UnmarshalTypeError) string {
	if te.Type == nil {
		return "another type"
	}
	switch te.Type.Kind().String() {
	case "slice":
		if te.Type.Elem().Kind().String() == "uint8" {
			return "a base64 string"
		}
		return "an array"
	case "map", "struct":
		return "an object"
	case "string":
		return "a string"
	case "int", "int64":
		return "an integer"
	default:
		return "a " + te.Type.String()
	}
}

func (s *server) handleExec(w http.ResponseWriter, r *http.Request) {
	// The whole body is read before the command starts: net/http notices a client that goes away
	// (and cancels r.Context) only once the body was read to its end.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxExecBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the exec body is larger than %d bytes", MaxExecBodyBytes), "body")
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_request", "cannot read the body: "+err.Error(), "")
		return
	}
	spec, apiErr := decodeExecRequest(body, s.root)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	// Not flushed here: the status goes out with the first output, or with the result. Under
	// gVisor every write to the socket costs the caller a third of a millisecond, and a command
	// without output is then answered in one write.
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	emit := func(stream string, data []byte) error {
		if err := enc.Encode(newChunkLine(stream, data)); err != nil {
			return err
		}
		return rc.Flush()
	}
	res, gone := s.runExec(r.Context(), spec, emit)
	if !gone {
		_ = enc.Encode(res) // sent as the handler returns
	}
	// Logged beside the answer, not before it: the log is a write to the guest's console, which
	// under gVisor would cost the exec's caller another half millisecond or so.
	go s.log.Info("exec", "argv0", spec.argv[0], "exit_code", res.ExitCode, "duration_ms", res.DurationMs, "timed_out", res.TimedOut, "client_gone", gone)
}

// roundedMs is d in whole milliseconds, to the nearest: a command's duration_ms, which the
// caller subtracts from its own round trip to see the platform's share. Truncated, a 0.9 ms
// command read as 0 ms, and its time as the platform's.
func roundedMs(d time.Duration) int64 { return (d + time.Millisecond/2).Milliseconds() }

// outChunk is a piece of a command's output on its way to the client.
type outChunk struct {
	stream string
	data   []byte
}

// runExec runs spec, passing output to emit as it comes, and returns the result and whether
// the client went away (emit failed or ctx ended: the process group was killed then).
func (s *server) runExec(ctx context.Context, spec execSpec, emit func(stream string, data []byte) error) (resultLine, bool) {
	start := time.Now()
	elapsed := func() int64 { return roundedMs(time.Since(start)) }
	fail := func(code int, msg string) (resultLine, bool) {
		err := emit("stderr", []byte("wb agent: "+msg+"\n"))
		return resultLine{ExitCode: code, DurationMs: elapsed()}, err != nil
	}
	if spec.runner != "" {
		if p := s.claimRunner(spec); p != nil {
			return s.streamProc(ctx, p, spec.timeout, start, emit)
		}
	}
	p, failed := s.startProc(spec)
	if failed != "" {
		code := ExitCannotRun
		if p.notFound {
			code = ExitNotFound
		}
		return fail(code, failed)
	}
	return s.streamProc(ctx, p, spec.timeout, start, emit)
}

// proc is a started command: its output pipes, and a channel closed once it was waited for.
type proc struct {
	cmd        *exec.Cmd
	pid        int
	outR, errR *os.File
	waited     chan struct{}
	notFound   bool // why it did not start: not found (127), else cannot run (126)
}

// startProc starts spec's command with its output on pipes, and waits for it in the
// background. It answers why it could not start ("" when it did).
func (s *server) startProc(spec execSpec) (*proc, string) {
	return s.startProcFiles(spec, nil, nil)
}

// startProcFiles is startProc with the command's stdin (nil: spec.stdin, or /dev/null) and
// extra files (fd 3 on) given.
func (s *server) startProcFiles(spec execSpec, stdin *os.File, extra []*os.File) (*proc, string) {
	p := &proc{}
	path, err := lookPath(spec.argv[0], envValue(spec.env, "PATH"), spec.dir)
	if err != nil {
		p.notFound = !errors.Is(err, errNotRegular)
		return p, err.Error()
	}
	outR, outW, err := outputPipe()
	if err != nil {
		return p, "cannot create a pipe: " + err.Error()
	}
	errR, errW, err := outputPipe()
	if err != nil {
		_, _ = outR.Close(), outW.Close()
		return p, "cannot create a pipe: " + err.Error()
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        spec.argv,
		Env:         spec.env,
		Dir:         spec.dir,
		Stdout:      outW,
		Stderr:      errW,
		ExtraFiles:  extra,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
		// Stdin is copied by a goroutine of os/exec; a background process that keeps the pipe
		// open without reading must not hold Wait up.
		WaitDelay: time.Second,
	}
	switch {
	case stdin != nil:
		cmd.Stdin = stdin
	case len(spec.stdin) > 0:
		cmd.Stdin = bytes.NewReader(spec.stdin)
	case s.devNull != nil:
		cmd.Stdin = s.devNull
	}
	pid, err := s.procs.start(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	_, _ = outW.Close(), errW.Close()
	if err != nil {
		_, _ = outR.Close(), errR.Close()
		p.notFound = errors.Is(err, fs.ErrNotExist)
		return p, startError(spec.argv[0], err)
	}
	p.cmd, p.pid, p.outR, p.errR, p.waited = cmd, pid, outR, errR, make(chan struct{})
	go func() {
		_ = cmd.Wait() // ErrWaitDelay at worst; ProcessState is set regardless
		s.procs.release(pid)
		close(p.waited)
	}()
	return p, ""
}

// streamProc passes p's output to emit as it comes until p exits (killing its process group
// at timeout, or when the client goes away), and answers its result and whether the client
// went away. It closes p's pipes.
func (s *server) streamProc(ctx context.Context, p *proc, timeout time.Duration, start time.Time, emit func(stream string, data []byte) error) (resultLine, bool) {
	pid := p.pid
	return streamOutput(ctx, p.outR, p.errR, p.waited, func() int { return exitCode(p.cmd.ProcessState) },
		func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }, timeout, start, emit)
}

// streamOutput is streamProc's work for any command: its output on outR and errR, waited
// closed once it ended, exit its exit code then, and kill ending it and whatever it started
// (a process group here; a whole guest for a direct one, DirectGuest). It closes outR and errR.
func streamOutput(ctx context.Context, outR, errR *os.File, waited <-chan struct{}, exit func() int, kill func(),
	timeout time.Duration, start time.Time, emit func(stream string, data []byte) error) (resultLine, bool) {
	elapsed := func() int64 { return roundedMs(time.Since(start)) }
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	drain := &drainState{}
	chunks := make(chan outChunk, 4)
	var readers sync.WaitGroup
	readers.Go(func() { pump(runCtx, "stdout", outR, chunks, drain) })
	readers.Go(func() { pump(runCtx, "stderr", errR, chunks, drain) })
	go func() {
		readers.Wait()
		close(chunks)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var exited, timedOut, gone bool
	ctxDone := ctx.Done()
	for chunks != nil || !exited {
		select {
		case c, ok := <-chunks:
			if !ok {
				chunks = nil
				continue
			}
			if gone {
				continue
			}
			if err := emit(c.stream, c.data); err != nil {
				gone = true
				kill()
				cancel()
			}
		case <-waited:
			exited, waited = true, nil
			timer.Stop()
			drain.begin(outR, errR)
		case <-timer.C:
			if !exited {
				timedOut = true
				kill()
			}
		case <-ctxDone:
			ctxDone = nil
			gone = true
			kill()
			cancel()
		}
	}
	_, _ = outR.Close(), errR.Close()
	res := resultLine{ExitCode: exit(), DurationMs: elapsed(), TimedOut: timedOut}
	if timedOut {
		res.ExitCode = ExitTimedOut
	}
	return res, gone
}

// exitCode is the shell's view of a status: the exit status, or 128+signal.
func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// pump reads f in chunks of up to outputChunkBytes and sends them on out, never splitting a
// UTF-8 sequence. It ends at EOF, at the drain deadline, or when ctx ends.
func pump(ctx context.Context, stream string, f *os.File, out chan<- outChunk, drain *drainState) {
	buf := make([]byte, outputChunkBytes)
	held := 0 // bytes of an incomplete UTF-8 sequence kept at buf's start
	send := func(b []byte) bool {
		select {
		case out <- outChunk{stream: stream, data: bytes.Clone(b)}:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		drain.arm(f)
		n, err := f.Read(buf[held:])
		if errors.Is(err, os.ErrDeadlineExceeded) && !drain.over() {
			// The drain deadline can pass before this goroutine reads at all (a loaded host):
			// what the command wrote before it exited is in the pipe still. An echo's output
			// was lost so. Take what is there without waiting; more, and the loop goes on.
			n, err = readReady(f, buf[held:])
		}
		data := buf[:held+n]
		if err != nil {
			if len(data) > 0 {
				send(data)
			}
			return
		}
		cut := completeUTF8(data)
		if cut > 0 && !send(data[:cut]) {
			return
		}
		held = copy(buf, data[cut:])
	}
}

// completeUTF8 returns the length of b without a trailing incomplete UTF-8 sequence.
func completeUTF8(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

// drainState bounds how long the pipes are read after the command exited.
type drainState struct {
	mu       sync.Mutex
	exited   bool
	hardStop time.Time
}

func (d *drainState) begin(files ...*os.File) {
	now := time.Now()
	d.mu.Lock()
	d.exited = true
	d.hardStop = now.Add(drainMax)
	d.mu.Unlock()
	for _, f := range files {
		_ = f.SetReadDeadline(now.Add(drainIdle))
	}
}

// over reports whether the drain's hard stop has passed: nothing more is read then.
func (d *drainState) over() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.exited && !time.Now().Before(d.hardStop)
}

// readReady reads what f's pipe holds now, without waiting (f is non-blocking, as outputPipe
// makes it) and whatever f's deadline: n > 0 with a nil error, or 0 with io.EOF (the writers
// are gone) or os.ErrDeadlineExceeded (nothing there).
func readReady(f *os.File, buf []byte) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	if err := rc.Control(func(fd uintptr) {
		for {
			n, rerr = syscall.Read(int(fd), buf)
			if rerr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return 0, err
	}
	switch {
	case rerr == syscall.EAGAIN:
		return 0, os.ErrDeadlineExceeded
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (d *drainState) arm(f *os.File) {
	d.mu.Lock()
	exited, hardStop := d.exited, d.hardStop
	d.mu.Unlock()
	if exited {
		deadline := time.Now().Add(drainIdle)
		if deadline.After(hardStop) {
			deadline = hardStop
		}
		_ = f.SetReadDeadline(deadline)
	}
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// errNotRegular: a command's path names something other than a regular file, which no exec
// runs (a shell answers 126). Refused before the start: gVisor's execve (runsc 20221219)
// opens a FIFO before it looks at its type, and waits in that open for a writer; the start
// then held the agent's spawner, and every later start, and under runsc its one P (the
// vfork's raw system call keeps it), the health probe with it, past the exec's timeout.
var errNotRegular = errors.New("not a regular file")

// lookPath finds file as a shell would with PATH=pathEnv, relative entries and relative paths
// being taken from dir. A name with a slash is used as it is.
func lookPath(file, pathEnv, dir string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("%q: %w", file, err)
		}
		if !fi.Mode().IsRegular() {
			return "", fmt.Errorf("%q: %w (mode %v)", file, errNotRegular, fi.Mode())
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: executable file not found in $PATH", file)
}

// startError explains why a command could not start; a guest at its process limit (EAGAIN
// from fork) is told so, and what to do.
func startError(argv0 string, err error) string {
	if errors.Is(err, syscall.EAGAIN) {
		return fmt.Sprintf("cannot start %q: the guest is at its process limit (%v); end some of its processes, or wait for them to end, and try again", argv0, err)
	}
	return fmt.Sprintf("cannot start %q: %v", argv0, err)
}
