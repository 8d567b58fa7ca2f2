package redisproc

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func needServer(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed")
	}
}

// TestStart: the server answers on its socket with its password, starts over a stale socket
// a killed run left, and is gone after Close.
func TestStart(t *testing.T) {
	needServer(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "redis")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// What a killed run leaves: a socket file nobody listens on.
	if err := os.WriteFile(filepath.Join(dir, "redis.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(s.Options())
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Its clients' connections are opaque to go-redis, which would otherwise peek at the
	// socket before every command (redisconn.Dialer).
	if c, err := s.Options().Dialer(ctx, "unix", s.Socket); err != nil {
		t.Error(err)
	} else {
		if _, peeks := c.(syscall.Conn); peeks {
			t.Errorf("a client's connection is a %T, which go-redis peeks at", c)
		}
		c.Close()
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v, want 0700", st.Mode().Perm())
	}
	s.Close()
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatal("answers after Close")
	}
}

// TestStartErrors: a socket path too long for a Unix socket is refused with a message that
// says what to do.
func TestStartErrors(t *testing.T) {
	needServer(t)
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	_, err := Start(context.Background(), long)
	if err == nil || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("a long path: %v; want an error that names --data-dir", err)
	}
}

// TestDiesWithParent: a wb killed with SIGKILL leaves no redis-server behind.
func TestDiesWithParent(t *testing.T) {
	needServer(t)
	if dir := os.Getenv("REDISPROC_CHILD_DIR"); dir != "" {
		s, err := Start(context.Background(), dir)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("pid", s.cmd.Process.Pid)
		time.Sleep(time.Minute) // until killed
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestDiesWithParent$")
	cmd.Env = append(os.Environ(), "REDISPROC_CHILD_DIR="+filepath.Join(t.TempDir(), "redis"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "pid ") {
		_ = cmd.Process.Kill()
		t.Fatalf("the child: %q %v", line, err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); strings.Contains(string(b), ") Z ") {
			break // a zombie awaiting its reaper is dead
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server %d outlived its parent", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
