package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestCounterRereads: the guard's reader of pids.current keeps the file open and answers what
// it holds at each read, not what it held at the first; without the file it errs.
func TestCounterRereads(t *testing.T) {
	c := &childCgroup{work: t.TempDir()}
	path := filepath.Join(c.work, "pids.current")
	if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	count, closeCount := c.counter()
	defer closeCount()
	for _, want := range []int{5, 12, 3} {
		if err := os.WriteFile(path, []byte(strconv.Itoa(want)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := count(); got != want || err != nil {
			t.Errorf("count after writing %d: %d, %v", want, got, err)
		}
	}
	none, closeNone := (&childCgroup{work: t.TempDir()}).counter()
	defer closeNone()
	if n, err := none(); err == nil {
		t.Errorf("a cgroup without pids.current: %d, no error", n)
	}
}
