package guest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
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
