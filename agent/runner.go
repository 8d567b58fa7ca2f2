package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"
)

// A runner is an interpreter started before the exec that uses it (a warm tier-1 guest's
// python3, its start already paid): it waits on fd 3 for one exec's frame and runs it as the
// plain command would. An exec that names it and fits it hands it the frame instead of
// starting a process; any other exec, or one that finds it gone, runs as usual.

const (
	runnerReadyDefault = 30 * time.Second
	runnerStderrMax    = 4 << 10 // of a failed loader's stderr, in the error
)

// waitingRunner is a started runner waiting for its exec.
type waitingRunner struct {
	argv          []string // what an exec's argv must start with (plus one argument)
	p             *proc
	stdinW, codeW *os.File
}

func (r *waitingRunner) close() {
	_ = syscall.Kill(-r.p.pid, syscall.SIGKILL)
	_, _ = r.stdinW.Close(), r.codeW.Close()
	<-r.p.waited
	_, _ = r.p.outR.Close(), r.p.errR.Close()
}

// runnerFrame is what a runner reads on fd 3: the working directory, each environment entry
// after a NUL, two NULs, then the code. (No part holds a NUL: exec requests are validated.)
func runnerFrame(dir string, env []string, code string) []byte {
	var b bytes.Buffer
	b.WriteString(dir)
	for _, kv := range env {
		b.WriteByte(0)
		b.WriteString(kv)
	}
	b.WriteString("\x00\x00")
	b.WriteString(code)
	return b.Bytes()
}

func (s *server) handleRunners(w http.ResponseWriter, r *http.Request) {
	var req RunnerRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxExecBodyBytes))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "the body must be a JSON object (RunnerRequest): "+err.Error(), "")
		return
	}
	switch {
	case req.Name == "":
		writeAPIError(w, badRequest("name", "name is required"))
		return
	case len(req.Argv) == 0 || req.Argv[0] == "":
		writeAPIError(w, badRequest("argv", "argv is required: a non-empty array of strings with a non-empty first element"))
		return
	case req.Loader == "" || strings.IndexByte(req.Loader, 0) >= 0:
		writeAPIError(w, badRequest("loader", "loader is required, without NUL bytes"))
		return
	case req.ReadyTimeoutS < 0 || req.ReadyTimeoutS > 600:
		writeAPIError(w, badRequest("ready_timeout_s", "ready_timeout_s must be 0 (the default, 30) or 1–600, got %d", req.ReadyTimeoutS))
		return
	}
	for i, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			writeAPIError(w, badRequest("argv", "argv[%d] contains a NUL byte", i))
			return
		}
	}
	ready := runnerReadyDefault
	if req.ReadyTimeoutS > 0 {
		ready = time.Duration(req.ReadyTimeoutS) * time.Second
	}
	pid, err := s.startRunner(r, req, ready)
	if err != nil {
		writeError(w, http.StatusBadGateway, "runner_failed", err.Error(), "loader")
		return
	}
	s.log.Info("runner ready", "name", req.Name, "pid", pid)
	writeJSON(w, http.StatusCreated, map[string]any{"name": req.Name, "pid": pid})
}

// startRunner starts req's loader and waits until it says it is ready; the runner then waits
// under req.Name (replacing one of that name).
func (s *server) startRunner(r *http.Request, req RunnerRequest, ready time.Duration) (int, error) {
	// The child's ends stay blocking and out of Go's poller (see outputPipe): os.Pipe's three
	// cost the runner's start 15 more trapped system calls under gVisor.
	stdinR, stdinW, err := inputPipe()
	if err != nil {
		return 0, fmt.Errorf("cannot create a pipe: %w", err)
	}
	codeR, codeW, err := inputPipe()
	if err != nil {
		_, _ = stdinR.Close(), stdinW.Close()
		return 0, fmt.Errorf("cannot create a pipe: %w", err)
	}
	readyR, readyW, err := outputPipe()
	if err != nil {
		_, _, _, _ = stdinR.Close(), stdinW.Close(), codeR.Close(), codeW.Close()
		return 0, fmt.Errorf("cannot create a pipe: %w", err)
	}
	spec := execSpec{argv: append(slices.Clone(req.Argv), req.Loader), env: commandEnv(nil), dir: s.root}
	// Idle for the guard from before its start (which wakes the guard) to its end: the loader
	// forks nothing, and a guard that saw it as a guest process sampled the count every 100 to
	// 200 ms while the interpreter started (each sample a few ms of host CPU under gVisor).
	s.mu.Lock()
	s.runnerStarts++
	s.mu.Unlock()
	p, failed := s.startProcFiles(spec, stdinR, []*os.File{codeR, readyW})
	s.mu.Lock()
	s.runnerStarts--
	if failed == "" {
		if s.starting == nil {
			s.starting = map[*proc]struct{}{}
		}
		s.starting[p] = struct{}{}
	}
	s.mu.Unlock()
	_, _, _ = stdinR.Close(), codeR.Close(), readyW.Close()
	if failed != "" {
		_, _, _ = stdinW.Close(), codeW.Close(), readyR.Close()
		return 0, errors.New(failed)
	}
	// Its death lowers the guest's process count before waitingRunners sees it (the reap
	// comes before p.waited closes): a guard that sampled between them sleeps, so wake it.
	go func() {
		<-p.waited
		s.procs.wake()
	}()
	wr := &waitingRunner{argv: slices.Clone(req.Argv), p: p, stdinW: stdinW, codeW: codeW}
	got := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := readyR.Read(b[:])
		got <- err
	}()
	timer := time.NewTimer(ready)
	defer timer.Stop()
	var why string
	select {
	case err = <-got:
		if err == nil {
			break
		}
		why = "it exited before it was ready"
		<-p.waited
		why += fmt.Sprintf(" (exit code %d)", exitCode(p.cmd.ProcessState))
	case <-timer.C:
		why = fmt.Sprintf("it was not ready within %s", ready)
	case <-r.Context().Done():
		why = "the caller went away"
	}
	_ = readyR.Close()
	if why != "" {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		<-p.waited
		s.mu.Lock()
		delete(s.starting, p)
		s.mu.Unlock()
		msg := tail(p.errR)
		wr.close()
		return 0, fmt.Errorf("runner %s: %s; its stderr: %q", req.Name, why, msg)
	}
	s.mu.Lock()
	delete(s.starting, p)
	old := s.runners[req.Name]
	s.runners[req.Name] = wr
	s.mu.Unlock()
	if old != nil {
		old.close()
	}
	return p.pid, nil
}

// tail reads what f holds, at most runnerStderrMax bytes, without waiting for more.
func tail(f *os.File) string {
	_ = f.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	b, _ := io.ReadAll(io.LimitReader(f, runnerStderrMax))
	return string(b)
}

// claimRunner hands spec to the runner it names, when one waits, lives and fits spec's argv,
// and answers the runner's process; nil when spec must run as usual.
func (s *server) claimRunner(spec execSpec) *proc {
	s.mu.Lock()
	wr := s.runners[spec.runner]
	if wr == nil || len(spec.argv) != len(wr.argv)+1 || !slices.Equal(spec.argv[:len(wr.argv)], wr.argv) {
		s.mu.Unlock()
		return nil
	}
	delete(s.runners, spec.runner)
	s.mu.Unlock()
	s.procs.wake() // the runner is about to run the exec's code
	select {
	case <-wr.p.waited: // it died while it waited
		s.log.Warn("runner died before its exec; running it as usual", "name", spec.runner, "exit_code", exitCode(wr.p.cmd.ProcessState))
		wr.close()
		return nil
	default:
	}
	frame := runnerFrame(spec.dir, spec.env, spec.argv[len(spec.argv)-1])
	// Both writes may block on a full pipe until the code reads; neither holds up the output.
	go func() {
		_, _ = wr.codeW.Write(frame)
		_ = wr.codeW.Close()
	}()
	go func() {
		if len(spec.stdin) > 0 {
			_, _ = wr.stdinW.Write(spec.stdin)
		}
		_ = wr.stdinW.Close()
	}()
	return wr.p
}

// waitingRunners answers how many runners wait for their code, or are starting: guest
// processes that fork nothing before an exec claims them. A runner that died waiting (a guest
// process killed it, or the fork-bomb guard's kill of every process did) stays listed until an
// exec names it but is no process: counted, it let another process pass for it and fork
// unwatched. So are runner starts not yet forked, but one: forks are made one at a time, and
// the rest wait their turn with no process (guest root can queue any number of them through
// the agent's socket, and each counted hid a process of a bomb from the guard).
func (s *server) waitingRunners() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(s.runnerStarts, 1)
	for p := range s.starting {
		select {
		case <-p.waited:
		default:
			n++
		}
	}
	for _, wr := range s.runners {
		select {
		case <-wr.p.waited:
		default:
			n++
		}
	}
	return n
}

// dropRunners kills every waiting runner (on shutdown).
func (s *server) dropRunners() {
	s.mu.Lock()
	rs := s.runners
	s.runners = map[string]*waitingRunner{}
	s.mu.Unlock()
	for _, wr := range rs {
		wr.close()
	}
}
