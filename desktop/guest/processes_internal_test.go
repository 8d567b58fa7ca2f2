package guest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProcessesRunning runs startScript's process functions in the host's /bin/sh: a process
// counts as running while it lives with its command line, or while that reads empty in the
// middle of an exec (a /proc faked here, since no real exec holds still); a zombie, a pid with
// another command line and a gone pid do not; exited names a launched process's exit status.
func TestProcessesRunning(t *testing.T) {
	dir := t.TempDir()
	fakeProc := filepath.Join(dir, "proc")
	for pid, stat := range map[string]string{"4242": "4242 (setsid) R 1 4242", "4343": "4343 (Xvfb) Z 1 4343"} {
		if err := os.MkdirAll(filepath.Join(fakeProc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(fakeProc, pid, "cmdline"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(fakeProc, pid, "stat"), []byte(stat+" 0 0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := processes + `
answer() { if running "$@"; then echo "$1 running"; else echo "$1 not running"; fi; }
launch sleeper sleep 30
launch quitter sh -c 'exit 3'
sleep 0.5 # the quitter is a zombie now, this shell's child until it waits
answer sleeper sleep
answer quitter sh
exited quitter Quitter
echo $(cat "$S/sleeper.pid") >"$S/reused.pid"; answer reused Xvfb
echo 2147483000 >"$S/gone.pid"; answer gone Xvfb
answer missing Xvfb
P=` + fakeProc + `
echo 4242 >"$S/execing.pid"; answer execing Xvfb
echo 4343 >"$S/dead.pid"; answer dead Xvfb
kill "$(cat "$S/sleeper.pid")"
`
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), "S="+dir, "P=/proc")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := `sleeper running
quitter not running
Quitter exited (status 3):
reused not running
gone not running
missing not running
execing running
dead not running
`
	if got := string(out); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// TestProcessesRunningExecEndsBetweenReads: running reads the command line once. It read it
// twice (grep, then tr when grep found no match): a process whose exec ended between the two
// reads (empty, then the program's) counted as not running, and the start waited for the live
// Xvfb to exit (exited's wait) until its exec's timeout killed it, "/bin/sh did not finish
// within 119s" (in a runc desktop guest beside a conformance run, 7 of 300 launches of Xvfb
// had the two reads disagree). Here the command line is a FIFO that answers empty to its first
// reader and the program's to the next.
func TestProcessesRunningExecEndsBetweenReads(t *testing.T) {
	dir := t.TempDir()
	pid := filepath.Join(dir, "proc", "4545")
	if err := os.MkdirAll(pid, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pid, "stat"), []byte("4545 (Xvfb) R 1 4545 0 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("mkfifo", filepath.Join(pid, "cmdline")).Run(); err != nil {
		t.Fatal(err)
	}
	// The writer: an empty command line for the first reader (its exec under way), then, once
	// that reader has had its EOF, the program's for any later one. The script ends it.
	script := processes + `
F="$P/4545/cmdline"
{ : >"$F"; sleep 1; printf '/usr/bin/Xvfb\000:0\000' >"$F"; } & w=$!
echo 4545 >"$S/xvfb.pid"
if running xvfb Xvfb; then echo "xvfb running"; else echo "xvfb not running"; fi
kill "$w" 2>/dev/null || :
`
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), "S="+dir, "P="+filepath.Join(dir, "proc"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := string(out); got != "xvfb running\n" {
		t.Errorf("a process whose exec ended between the looks at its command line: %q, want %q", got, "xvfb running\n")
	}
}

// TestExitedDoesNotWaitForALiveProcess: exited, called once running took a process for gone,
// answers at once when it lives after all, saying what it is, rather than wait for it to end:
// such a wait (for a live Xvfb) held the setup until its exec's timeout killed it, with
// nothing said.
func TestExitedDoesNotWaitForALiveProcess(t *testing.T) {
	dir := t.TempDir()
	script := processes + `
launch sleeper sleep 600
sleep 0.2 # past its exec
exited sleeper Sleeper
`
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(dir, "sleeper.pid")); err == nil {
			_ = exec.Command("kill", strings.TrimSpace(string(b))).Run()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	cmd.Env = append(os.Environ(), "S="+dir, "P=/proc")
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("exited still waited for the live sleeper after 60 s: %v: %q", err, out)
	}
	if err != nil || !strings.Contains(string(out), "Sleeper is not running as launched: pid ") || !strings.Contains(string(out), "sleep 600") {
		t.Errorf("exited of a live process: %v: %q", err, out)
	}
}
