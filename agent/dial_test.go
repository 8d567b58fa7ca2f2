package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDialSocketRefusesSymlinks: a guest that replaces its agent's socket with a symlink to a
// host socket (or file) must not get the node to connect there or chmod it.
func TestDialSocketRefusesSymlinks(t *testing.T) {
	dir := t.TempDir()
	host := filepath.Join(dir, "host.sock") // stands for Redis' or the node's own socket
	ln, err := net.Listen("unix", host)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The real socket is reachable.
	c, err := DialSocket(ctx, host)
	if err != nil {
		t.Fatalf("dial the socket itself: %v", err)
	}
	c.Close()
	<-accepted

	planted := filepath.Join(dir, "agent.sock")
	if err := os.Symlink(host, planted); err != nil {
		t.Fatal(err)
	}
	if c, err := DialSocket(ctx, planted); err == nil {
		c.Close()
		t.Fatal("dialled through a symlink the guest planted")
	}
	if err := ChmodSocket(planted, 0o666); err == nil {
		t.Fatal("chmod went through a symlink")
	}
	file := filepath.Join(dir, "plain")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := DialSocket(ctx, file); err == nil {
		c.Close()
		t.Fatal("dialled a plain file")
	}
	if err := ChmodSocket(file, 0o666); err == nil {
		t.Fatal("chmod of a plain file as a socket")
	}
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
		t.Fatalf("plain file mode changed to %v", fi.Mode())
	}
	if err := ChmodSocket(host, 0o666); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Lstat(host); fi.Mode().Perm() != 0o666 {
		t.Fatalf("socket mode %v, want 0666", fi.Mode().Perm())
	}
	select {
	case <-accepted:
		t.Fatal("the host socket saw a connection through the symlink")
	default:
	}
}
