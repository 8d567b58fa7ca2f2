package proc

import (
	"os"
	"os/exec"
	"testing"
)

// TestAlive: this process is alive under its own start time and not under another; a
// process that exited and was reaped is gone.
func TestAlive(t *testing.T) {
	start, ok := Start(os.Getpid())
	if !ok || start == "" {
		t.Fatalf("Start(self) = %q, %v", start, ok)
	}
	if !Alive(os.Getpid(), start) || Alive(os.Getpid(), start+"1") {
		t.Error("Alive(self) does not follow the start time")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if Alive(cmd.Process.Pid, "") {
		t.Error("a reaped process is alive")
	}
}
