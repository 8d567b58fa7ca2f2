package datadir

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSecondHolderTurnedAway: while one Lock is held, a second Acquire on the directory fails
// at once with a HeldError naming the holder and saying what to do; after Release it succeeds.
func TestSecondHolderTurnedAway(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // created by Acquire
	first, err := Acquire(dir, "wb serve")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir, "wb node")
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("second Acquire: %v, want a *HeldError", err)
	}
	if held.Holder.PID != os.Getpid() || held.Holder.Command != "wb serve" || time.Since(held.Holder.Since) > time.Minute {
		t.Fatalf("holder %+v, want pid %d, wb serve, since about now", held.Holder, os.Getpid())
	}
	for _, want := range []string{dir, "wb serve", "pid " + strconv.Itoa(os.Getpid()), "since ", "stop that one", "another --data-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	// A path through a symlink is the same directory, and the same lock.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(link, "wb serve"); !errors.As(err, &held) {
		t.Fatalf("Acquire through a symlink: %v, want a *HeldError", err)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := Acquire(dir, "wb node")
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	again.Release()
}

// TestHolderNotWrittenYet: a holder that has not written its details yet (or wrote garbage)
// is reported as unknown, not as a zero pid.
func TestHolderNotWrittenYet(t *testing.T) {
	dir := t.TempDir()
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir, "wb serve")
	var held *HeldError
	if !errors.As(err, &held) || held.Holder.PID != 0 || !strings.Contains(err.Error(), "pid is not written yet") {
		t.Fatalf("Acquire beside a silent holder: %v", err)
	}
}

// holdEnv makes this test binary a holder: it takes the lock of the directory named, starts a
// long-lived child (as wb starts runtimes whose sandboxes outlive it), reports both pids and
// waits to be killed.
const holdEnv = "WB_DATADIR_TEST_HOLD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(holdEnv); dir != "" {
		if _, err := Acquire(dir, "wb serve"); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		child := exec.Command("sleep", "600")
		if err := child.Start(); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("locked", child.Process.Pid)
		select {}
	}
	os.Exit(m.Run())
}

// TestKilledHolderDoesNotBlock: a holder killed with SIGKILL leaves its lock file behind but
// not its lock, even while a child it started lives on.
func TestKilledHolderDoesNotBlock(t *testing.T) {
	dir := t.TempDir()
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), holdEnv+"="+dir)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("holder said nothing: %v", err)
	}
	var childPID int
	if _, err := fmt.Sscanf(line, "locked %d", &childPID); err != nil {
		t.Fatalf("holder said %q", line)
	}
	defer syscall.Kill(childPID, syscall.SIGKILL)

	_, err = Acquire(dir, "wb node")
	var held *HeldError
	if !errors.As(err, &held) || held.Holder.PID != holder.Process.Pid {
		t.Fatalf("Acquire while the holder lives: %v, want a HeldError naming pid %d", err, holder.Process.Pid)
	}
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	if err := syscall.Kill(childPID, 0); err != nil {
		t.Fatalf("the holder's child is gone (%v); the test needs it alive", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, FileName)); !strings.Contains(string(b), strconv.Itoa(holder.Process.Pid)) {
		t.Fatalf("lock file %q: the killed holder's details should still be there", b)
	}
	l, err := Acquire(dir, "wb node")
	if err != nil {
		t.Fatalf("Acquire after the holder was killed (its child still running): %v", err)
	}
	defer l.Release()
	_, err = Acquire(dir, "wb serve")
	if !errors.As(err, &held) || held.Holder.PID != os.Getpid() || held.Holder.Command != "wb node" {
		t.Fatalf("the new holder's details: %v", err)
	}
}
