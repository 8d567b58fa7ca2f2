package node

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"wb/hypervisor"
)

// listsNone is a driver that lists no guest: every dir under guests is one it does not know.
type listsNone struct{ hypervisor.Driver }

func (listsNone) List(context.Context) ([]string, error) { return nil, nil }

// TestGuestDirsMountedBelowStay: reapGuestDirs leaves a dir with a mount below it however
// the data dir is spelled: through a symlink (/var/lib/wb on another disk), or with a space
// (which the mount table escapes). The mount table names the mount point resolved and
// escaped; a plain comparison with the data dir's spelling missed it, and os.RemoveAll went
// into the mounted file system (a guest's disk, its agent dir) and emptied it.
func TestGuestDirsMountedBelowStay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	base, err := os.MkdirTemp("", "wbgd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	real := filepath.Join(base, "disk")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	for name, dataDir := range map[string]string{"symlinked": link, "spaced": filepath.Join(base, "data dir")} {
		agentDir := filepath.Join(dataDir, "guests", "tbusy", "agent")
		if err := os.MkdirAll(agentDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", agentDir, "tmpfs", 0, "size=64k"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(agentDir, syscall.MNT_DETACH) })
		file := filepath.Join(agentDir, "a guest's file")
		if err := os.WriteFile(file, []byte("kept"), 0o600); err != nil {
			t.Fatal(err)
		}
		n := &Node{Config: Config{Driver: listsNone{}, DataDir: dataDir, Logger: slog.New(slog.DiscardHandler)}}
		n.reapGuestDirs(context.Background(), map[string]bool{})
		if _, err := os.Stat(file); err != nil {
			t.Errorf("%s data dir %s: the reap of gone guests' dirs went into a mount below one: %v", name, dataDir, err)
		}
	}
}
