package oci

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"wb/hypervisor"
)

// TestGuestsTasksWalk: the guests on the host are the cgroups below GuestsCgroup that hold
// tasks and have none below them, every node's (<node>/<guest>, and a guest directly below
// GuestsCgroup, as a node whose CgroupParent is GuestsCgroup lays them out); this driver's own
// are named by their id. A node's parent without guests, and a guest that holds no task, are
// no guests. GuestsTotal reads the total and its limit.
func TestGuestsTasksWalk(t *testing.T) {
	root := t.TempDir()
	write := func(p, file, v string) {
		t.Helper()
		dir := filepath.Join(root, p)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if file != "" {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("wb", "pids.current", "9950")
	write("wb", "pids.max", "10000")
	write("wb/n1", "pids.current", "9000")
	write("wb/n1/hog", "pids.current", "8800")
	write("wb/n1/by", "pids.current", "200")
	write("wb/n1/gone", "pids.current", "0")
	write("wb/n2", "pids.current", "900")
	write("wb/n2/other", "pids.current", "900")
	write("wb/n3", "pids.current", "0") // a node without guests
	write("wb/old", "pids.current", "50")
	d := &Driver{cg: cgroupHost{v1: map[string]string{"pids": root}}, guestsCgroup: "/wb", cgroupParent: "/wb/n1"}
	got, err := d.GuestsTasks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b hypervisor.GuestTasks) int { return strings.Compare(a.ID, b.ID) })
	want := []hypervisor.GuestTasks{{ID: "by", Own: true, Tasks: 200}, {ID: "hog", Own: true, Tasks: 8800}, {ID: "n2/other", Tasks: 900}, {ID: "old", Tasks: 50}}
	if !slices.Equal(got, want) {
		t.Errorf("GuestsTasks: %+v; want %+v", got, want)
	}
	if cur, limit, err := d.GuestsTotal(); cur != 9950 || limit != 10000 || err != nil {
		t.Errorf("GuestsTotal: %d of %d, %v; want 9950 of 10000", cur, limit, err)
	}
	// The limit is read again near it (an operator lowered it).
	write("wb", "pids.max", "9000")
	if _, limit, _ := d.GuestsTotal(); limit != 9000 {
		t.Errorf("GuestsTotal's limit after it was lowered near the total: %d; want 9000", limit)
	}
	d.guestsCgroup = "/none"
	if _, err := d.GuestsTasks(context.Background()); err == nil {
		t.Error("GuestsTasks of a GuestsCgroup that does not exist: no error")
	}
}
