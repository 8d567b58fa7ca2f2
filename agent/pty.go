package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"
)

const (
	ptyDefaultCols = 80
	ptyDefaultRows = 24
	ptyMaxSize     = 1000
	ptyReadLimit   = 1 << 20
	// A PTY whose client left gets SIGHUP, then SIGKILL after ptyHangupGrace.
	ptyHangupGrace = 2 * time.Second
)

// ptySize reads ?cols= and ?rows= (1–1000; defaults 80×24).
func ptySize(r *http.Request) (cols, rows int, apiErr *Error) {
	get := func(name string, def int) (int, *Error) {
		v := r.URL.Query().Get(name)
		if v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > ptyMaxSize {
			return 0, badRequest(name, "%s must be an integer 1–%d, got %q", name, ptyMaxSize, v)
		}
		return n, nil
	}
	if cols, apiErr = get("cols", ptyDefaultCols); apiErr != nil {
		return 0, 0, apiErr
	}
	if rows, apiErr = get("rows", ptyDefaultRows); apiErr != nil {
		return 0, 0, apiErr
	}
	return cols, rows, nil
}

// handlePTY upgrades to a WebSocket and runs ?command= (by /bin/sh -c; default an interactive
// /bin/sh) on a PTY of ?cols= × ?rows=, in ?cwd= (default Root). Binary frames carry terminal
// bytes both ways; a text frame {"type":"resize","cols":N,"rows":N} resizes. When the process
// exits the agent sends {"type":"exit","exit_code":N} and closes with 1000 (normal closure).
// When the client goes, the process's session gets SIGHUP, then SIGKILL.
func (s *server) handlePTY(w http.ResponseWriter, r *http.Request) {
	cols, rows, apiErr := ptySize(r)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	q := r.URL.Query()
	argv := []string{"/bin/sh"}
	if c := q.Get("command"); c != "" {
		argv = []string{"/bin/sh", "-c", c}
	}
	dir, apiErr := resolvePath(s.root, q.Get("cwd"), "cwd")
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	env := commandEnv(map[string]string{"TERM": "xterm"})
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		writeAPIError(w, badRequest("cwd", "%s is not a directory", dir))
		return
	}

	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		// Only the node reaches this socket; browsers' Origin headers it forwards are not ours
		// to judge.
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
	})
	if err != nil {
		s.log.Warn("pty: websocket accept failed", "err", err)
		return // Accept wrote the HTTP error
	}
	ws.SetReadLimit(ptyReadLimit)
	// The request's context is not to be used after a hijack: the session's own ends with Serve's
	// context, and closeSessions (quiesce, shutdown) cancels it.
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	s.addSession(ws, cancel)
	defer s.removeSession(ws)

	ptmx, tty, err := openPTY(cols, rows)
	if err != nil {
		s.log.Warn("pty: open failed", "err", err)
		_ = ws.Close(websocket.StatusInternalError, "cannot open a pty")
		return
	}
	defer tty.Close()
	cmd := &exec.Cmd{
		Path: argv[0], Args: argv, Env: env, Dir: dir,
		Stdin: tty, Stdout: tty, Stderr: tty,
		// A new session whose controlling terminal is the pty (the child's fd 0).
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Setctty: true},
	}
	pid, err := s.procs.start(func() (int, error) {
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	if err != nil {
		_ = ptmx.Close()
		s.log.Warn("pty: start failed", "err", err)
		reason := "cannot start the command"
		if errors.Is(err, syscall.EAGAIN) {
			reason = "cannot start the command: the guest is at its process limit"
		}
		_ = ws.Close(websocket.StatusInternalError, reason)
		return
	}
	s.log.Info("pty started", "pid", pid, "cols", cols, "rows", rows)
	code, gone := s.runPTY(ctx, ws, cmd, pid, ptmx, tty)
	s.log.Info("pty ended", "pid", pid, "exit_code", code, "client_gone", gone)
}

// runPTY pumps bytes between ws and ptmx until the process exits or the client goes.
//
// The agent keeps the terminal's slave side open (tty): resizes go through it, and the master's
// end of output is found the same way everywhere, by the process's exit and then a pause in its
// output. (Linux reports EIO on the master once the slave is closed; gVisor reports nothing, and
// a blocking read there would never return.)
func (s *server) runPTY(ctx context.Context, ws *websocket.Conn, cmd *exec.Cmd, pid int, ptmx, tty *os.File) (int, bool) {
	defer ptmx.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		s.procs.release(pid)
		close(exited)
	}()

	drain := &drainState{}
	outDone := make(chan struct{})
	go func() { // terminal → client
		defer close(outDone)
		buf := make([]byte, outputChunkBytes)
		for {
			drain.arm(ptmx)
			n, err := ptmx.Read(buf)
			if n > 0 {
				if werr := ws.Write(ctx, websocket.MessageBinary, buf[:n]); werr != nil {
					cancel()
					return
				}
			}
			if err != nil { // the drain deadline after the exit, or the master closed
				return
			}
		}
	}()

	inDone := make(chan struct{})
	go func() { // client → terminal
		defer close(inDone)
		defer cancel()
		for {
			typ, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if _, err := ptmx.Write(data); err != nil {
					return
				}
				continue
			}
			var m ptyMessage
			if err := json.Unmarshal(data, &m); err != nil || m.Type != "resize" {
				s.log.Warn("pty: ignored a text frame that is not a resize message", "len", len(data))
				continue
			}
			if m.Cols < 1 || m.Cols > ptyMaxSize || m.Rows < 1 || m.Rows > ptyMaxSize {
				s.log.Warn("pty: ignored a resize out of range", "cols", m.Cols, "rows", m.Rows)
				continue
			}
			if err := pty.Setsize(tty, &pty.Winsize{Cols: uint16(m.Cols), Rows: uint16(m.Rows)}); err != nil {
				s.log.Warn("pty: resize failed", "err", err)
			}
		}
	}()

	select {
	case <-exited:
		drain.begin(ptmx)
		select {
		case <-outDone:
		case <-time.After(drainMax + time.Second): // a client that reads nothing
			cancel()
			<-outDone
		}
		code := exitCode(cmd.ProcessState)
		msg, _ := json.Marshal(ptyMessage{Type: "exit", ExitCode: &code})
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		_ = ws.Write(wctx, websocket.MessageText, msg)
		wcancel()
		_ = ws.Close(websocket.StatusNormalClosure, "process exited")
		cancel()
		_ = ptmx.SetWriteDeadline(time.Now()) // input nobody reads any more must not hold us
		<-inDone
		return code, false
	case <-ctx.Done():
	}
	// The client went away (or the agent is quiescing or stopping): hang the session up.
	_ = ws.CloseNow()
	signalSession(pid, syscall.SIGHUP)
	t := time.NewTimer(ptyHangupGrace)
	select {
	case <-exited:
		t.Stop()
	case <-t.C:
		signalSession(pid, syscall.SIGKILL)
		<-exited
	}
	drain.begin(ptmx)
	_ = ptmx.SetWriteDeadline(time.Now())
	<-outDone
	<-inDone
	return exitCode(cmd.ProcessState), true
}

// openPTY opens a pty pair of cols × rows. The master is made non-blocking and pollable (pty.Open
// leaves it in blocking mode), so that read deadlines work on it.
func openPTY(cols, rows int) (ptmx, tty *os.File, err error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	defer m.Close()
	if err := pty.Setsize(tty, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
		_ = tty.Close()
		return nil, nil, fmt.Errorf("size pty: %w", err)
	}
	fd, _, errno := syscall.Syscall(syscall.SYS_FCNTL, m.Fd(), syscall.F_DUPFD_CLOEXEC, 0)
	if errno != 0 {
		_ = tty.Close()
		return nil, nil, fmt.Errorf("dup pty master: %w", errno)
	}
	if err := syscall.SetNonblock(int(fd), true); err != nil {
		_ = syscall.Close(int(fd))
		_ = tty.Close()
		return nil, nil, fmt.Errorf("pty master non-blocking: %w", err)
	}
	return os.NewFile(fd, "/dev/ptmx"), tty, nil
}
