package chvtest

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestReapStale: the state dir of a fakech that was killed (its owner file names a process
// that is gone) is removed with the mounts below it; a live fakech's dir, and a dir with no
// owner file yet (its fakech is starting), are left alone.
func TestReapStale(t *testing.T) {
	parent := t.TempDir()
	mk := func(name string) string {
		d := filepath.Join(parent, name)
		if err := os.MkdirAll(filepath.Join(d, "guest", "writable"), 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	dead, live, starting := mk("fakech-dead"), mk("fakech-live"), mk("fakech-starting")
	other := mk("other-dead") // not fakech's: another prefix

	// A process that has ended: its pid names no live process with its start time.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	gone := ownerLine(cmd.Process.Pid, "1")
	for _, d := range []string{dead, other} {
		if err := os.WriteFile(filepath.Join(d, ownerFile), []byte(gone), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := ClaimStateDir(live); err != nil {
		t.Fatal(err)
	}
	// The killed fakech's guest disk, and a live one's: tmpfs mounts stand in for the loop
	// mounts.
	for _, d := range []string{dead, live} {
		w := filepath.Join(d, "guest", "writable")
		if err := syscall.Mount("tmpfs", w, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(w, syscall.MNT_DETACH) })
	}

	if n := ReapStale(parent, "fakech-", slog.New(slog.NewTextHandler(io.Discard, nil))); n != 1 {
		t.Fatalf("ReapStale removed %d dirs, want 1", n)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Fatalf("the killed fakech's dir is still there: %v", err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), dead+"/") {
		t.Fatal("the killed fakech's guest disk is still mounted")
	}
	if !strings.Contains(string(mounts), live+"/guest/writable") {
		t.Fatal("the live fakech's guest disk was unmounted")
	}
	for _, d := range []string{live, starting, other} {
		if _, err := os.Stat(filepath.Join(d, "guest")); err != nil {
			t.Fatalf("%s was touched: %v", d, err)
		}
	}
}
