package guestfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"wb/hypervisor"
)

// TestRecords: a record written is read back; a missing one, or one of an id that could not
// be a guest's, is hypervisor.ErrNotFound; a damaged one is an error naming the guest.
func TestRecords(t *testing.T) {
	dir := t.TempDir()
	type rec struct{ Pid int }
	p := filepath.Join(dir, "guest.json")
	if err := WriteJSON(p, rec{Pid: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary file is left: %v", err)
	}
	var got rec
	if err := ReadGuest("x", "g1", p, &got); err != nil || got.Pid != 7 {
		t.Fatalf("read back %+v, %v", got, err)
	}
	for id, path := range map[string]string{"g2": filepath.Join(dir, "missing.json"), "../g": p} {
		if err := ReadGuest("x", id, path, &got); !errors.Is(err, hypervisor.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", id, err)
		}
	}
	if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ReadGuest("x", "g1", p, &got); err == nil || errors.Is(err, hypervisor.ErrNotFound) || !strings.Contains(err.Error(), "x: guest g1 record") {
		t.Errorf("a damaged record: %v", err)
	}
}

// TestDiskUsage: the blocks the files take, a sparse file's written ones only; a missing
// dir takes nothing.
func TestDiskUsage(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := DiskUsage(dir); got < 64<<10 || got > 1<<20 {
		t.Errorf("DiskUsage = %d; want the 64 KiB file's blocks and next to nothing for the sparse one", got)
	}
	if got := Allocated(filepath.Join(dir, "sparse")); got > 64<<10 {
		t.Errorf("Allocated(sparse) = %d", got)
	}
	if got := DiskUsage(filepath.Join(dir, "none")); got != 0 {
		t.Errorf("DiskUsage(missing) = %d, want 0", got)
	}
}
