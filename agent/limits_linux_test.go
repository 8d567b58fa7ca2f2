package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCounterRereads: the guard's reader of pids.current keeps the file open and answers what
// it holds at each read, not what it held at the first.
func TestCounterRereads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pids.current")
	if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	count := (&childCgroup{workCurrent: f}).counter()
	for _, want := range []int{5, 12, 3} {
		if err := os.WriteFile(path, []byte(strconv.Itoa(want)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := count(); got != want || err != nil {
			t.Errorf("count after writing %d: %d, %v", want, got, err)
		}
	}
}

// TestReadAllAt: a file past one read's buffer is read whole from its start, each time.
func TestReadAllAt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cgroup.procs")
	want := strings.Repeat("12345\n", 2000)
	if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 2 {
		if got, err := readAllAt(f); string(got) != want || err != nil {
			t.Fatalf("readAllAt: %d bytes, %v; want %d", len(got), err, len(want))
		}
	}
}
