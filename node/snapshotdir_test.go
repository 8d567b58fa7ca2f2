package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/session"
)

// restore_from and snapshot ids reach the node from the control plane; anything but a
// snapshot id is refused, so no path built from one leaves DataDir/snapshots.
func TestSnapshotDirRefusesNonIDs(t *testing.T) {
	n := &Node{Config: Config{DataDir: t.TempDir()}}
	victim := filepath.Join(n.DataDir, "x")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"../x", "..", "", "snap_../../x", "snap_", "snap_0000000000000000000/", "/etc", "sess_0000000000ABCDEFGHIJ", "snap_0000000000ABCDEFGH.."} {
		if dir, err := n.snapshotDir(id); err == nil || !strings.Contains(err.Error(), "not a snapshot id") {
			t.Fatalf("%q: dir %q err %v", id, dir, err)
		}
		if err := n.DeleteSnapshot(context.Background(), id); err == nil {
			t.Fatalf("DeleteSnapshot(%q) accepted", id)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatalf("a file outside snapshots/ was touched: %v", err)
	}
	id := session.NewID("snap_", time.Now())
	dir, err := n.snapshotDir(id)
	if err != nil || dir != filepath.Join(n.DataDir, "snapshots", id) {
		t.Fatalf("%q: %q %v", id, dir, err)
	}
}
