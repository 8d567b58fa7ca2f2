package redisproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redisconn"
)

const (
	readyTimeout = 15 * time.Second // a cold start on a loaded machine takes well under a second
	stopTimeout  = 5 * time.Second  // SIGTERM's grace before SIGKILL
	// maxSocketPath is the room a Unix socket's path has (sun_path is 108 bytes with its NUL).
	maxSocketPath = 107
	// InstallHint says how to get the server.
	InstallHint = "install it (make deps, or apt-get install -y redis-server), or give --redis URL"
)

// Server is a running redis-server.
type Server struct {
	// Socket is the Unix socket it listens on; Password is the default user's password.
	Socket, Password string
	cmd              *exec.Cmd
	done             chan struct{}
}

// Start runs redis-server (found on PATH) with its socket, log and working files in dir,
// which it creates with mode 0700, and returns once it answers PING.
func Start(ctx context.Context, dir string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not installed: %s", InstallHint)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("redis dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil { // a dir made earlier with a looser mode
		return nil, fmt.Errorf("redis dir: %w", err)
	}
	sock := filepath.Join(dir, "redis.sock")
	if len(sock) > maxSocketPath {
		return nil, fmt.Errorf("the embedded Redis's socket path %s is longer than a Unix socket allows (%d bytes): use a shorter --data-dir", sock, maxSocketPath)
	}
	// A previous run that was killed leaves its socket; the data-dir lock says it is ours.
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove the stale socket %s: %w", sock, err)
	}
	pw := make([]byte, 32)
	_, _ = rand.Read(pw) // crypto/rand.Read never fails (Go ≥ 1.24)
	s := &Server{Socket: sock, Password: hex.EncodeToString(pw), done: make(chan struct{})}
	logPath := filepath.Join(dir, "redis.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("redis log: %w", err)
	}
	defer logf.Close() // the child keeps its own descriptor
	// The password goes in through the config on stdin, not argv, where any local user could
	// read it in /proc.
	s.cmd = exec.Command(bin, "-")
	s.cmd.Dir = dir
	s.cmd.Stdin = strings.NewReader(strings.Join([]string{
		"port 0",
		"unixsocket " + sock,
		"unixsocketperm 700",
		"requirepass " + s.Password,
		`save ""`,
		"appendonly no",
		"daemonize no",
		`logfile ""`,
		"dir " + dir,
	}, "\n") + "\n")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// Killed with its parent: a wb that dies must not leave a server holding the state. (The
	// signal follows the OS thread that forked; Go ends a thread only when a goroutine locked
	// to it exits, which this one is not.)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()

	rdb := redis.NewClient(s.Options())
	defer rdb.Close()
	deadline := time.Now().Add(readyTimeout)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := rdb.Ping(pctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("redis-server exited at start (%s): %s", s.cmd.ProcessState, strings.TrimSpace(string(out)))
		default:
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			s.Close()
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("redis-server did not answer within %v: %v: %s", readyTimeout, err, strings.TrimSpace(string(out)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Options are a go-redis client's options for the server.
func (s *Server) Options() *redis.Options {
	return &redis.Options{Network: "unix", Addr: s.Socket, Password: s.Password, Dialer: redisconn.Dialer(0)}
}

// Close stops the server (SIGTERM, then SIGKILL after a grace) and waits for it.
func (s *Server) Close() {
	if s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return
	case <-time.After(stopTimeout):
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}
