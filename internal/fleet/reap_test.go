package fleet

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRemoveCgroupTree: a node's cgroup with an empty child left by a guest cut off
// mid-start (no runtime state, so no driver lists it) goes, child first, in every hierarchy
// it is in. (Seen: `wb fleet` with warm pools, stopped while a pool refilled.)
func TestRemoveCgroupTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	var made []string
	p := "/wb-fleet-test-" + randomHex(4)
	for _, root := range roots {
		if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
			continue // a symlink to a co-mounted hierarchy
		}
		if err := os.MkdirAll(filepath.Join(root, p, "wp-guest"), 0o755); err == nil {
			made = append(made, filepath.Join(root, p))
		}
	}
	if len(made) == 0 {
		t.Skip("no cgroup hierarchy to write to")
	}
	if err := removeCgroupTree(p); err != nil {
		t.Fatal(err)
	}
	for _, d := range made {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s is still there", d)
		}
	}
}
