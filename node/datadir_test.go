package node_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/node"
	"wb/session"
	"wb/store"
)

// TestDataDirFitsGuestSockets: New accepts the longest data dir in which a session's guest
// sockets still fit a Unix socket address (the node listens on the egress proxy's), and
// refuses one byte more.
func TestDataDirFitsGuestSockets(t *testing.T) {
	egressSock := func(dataDir string) string {
		return filepath.Join(dataDir, "guests", session.NewID("sess_", time.Now()), "agent", "egress.sock")
	}
	base := tempDir(t) + "/"
	longest := base + strings.Repeat("d", 107-len(egressSock(base+"d"))+1)
	cfg := node.Config{Store: store.New(nil), Driver: struct{ hypervisor.Driver }{}, Templates: catalog, DataDir: longest}
	if _, err := node.New(cfg); err != nil {
		t.Fatalf("data dir of %d bytes: %v", len(longest), err)
	}
	sock := egressSock(longest)
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("the longest data dir New accepts: listen on %s (%d bytes): %v", sock, len(sock), err)
	}
	ln.Close()
	cfg.DataDir = longest + "d"
	if _, err := node.New(cfg); err == nil || !strings.Contains(err.Error(), "is too long for the guests' Unix sockets") {
		t.Fatalf("data dir of %d bytes: %v, want refused as too long", len(cfg.DataDir), err)
	}
}
