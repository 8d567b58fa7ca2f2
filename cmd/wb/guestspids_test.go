//go:build linux

package main

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"wb/hypervisor"
	"wb/internal/syncbuf"
)

// TestNodeCapsEveryNodesGuests: a node caps the process total of /wb, the cgroup of every
// node's guests on the host, not only of its own /wb/<node>: one tenant's guests on one node
// must not take the process ids that another node's guests and the platform need. (This
// sets the host's real /wb, as every node started here does.)
func TestNodeCapsEveryNodesGuests(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the oci driver needs root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed")
	}
	logs := &syncbuf.Buffer{}
	drv, err := newDriver(nodeFlags{backend: "oci", runtime: "runc", dataDir: t.TempDir(), id: "node_pids"}, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		releaseRunDir(drv, slog.New(slog.NewTextHandler(io.Discard, nil)))
		_ = drv.(hypervisor.CgroupOwner).RemoveCgroupParent()
	})
	if !strings.Contains(logs.String(), "guests' process total capped") || !strings.Contains(logs.String(), "cgroup="+guestsCgroup+" ") {
		t.Errorf("the node did not cap the process total of %s, every node's guests' cgroup; its log:\n%s", guestsCgroup, logs.String())
	}
}
