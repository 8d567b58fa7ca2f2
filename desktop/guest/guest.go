package guest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/templates"
)

// Execer runs one command in a running guest and answers its result (a session exec).
type Execer interface {
	Exec(ctx context.Context, argv []string, stdin []byte) (stdout, stderr []byte, exitCode int, err error)
}

// Template is the template a desktop's guest runs.
const Template = templates.Desktop

// The display every desktop has, and where its parts live in the guest.
const (
	Display = ":0"
	Width   = 1280
	Height  = 800
	// ProfileDir is Chromium's profile (logins, history, downloads' records): under /root,
	// which is on the guest's writable disk, as is /data/memory (templates.DesktopData).
	ProfileDir = "/root/.config/chromium"
	// MemoryDir is where a desktop's agent keeps what it remembers.
	MemoryDir = templates.DesktopData + "/memory"
	// stateDir holds the pid files and logs of the processes Start launches. It is in the
	// sandbox's memory (/dev/shm), never on the disk: a snapshot restores it with the
	// processes it names, and a fresh start from the disk begins without it. On the disk, an
	// earlier life's pid file names a pid that this life hands out again in the same order
	// (a new pid namespace counts from 1), perhaps to the very grep that checks it.
	stateDir = "/dev/shm/wb-desktop"
)

// Bounds of RunJS.
const (
	MaxScriptBytes = 1 << 20
	// MaxResultBytes bounds a script's value as JSON. Chromium serializes the whole value and
	// carries it over the DevTools pipe before the size can be checked: under gVisor on a
	// loaded 2-core host a 5 MiB string took over 30 s (twice, in cold make test runs). A
	// megabyte is more than an agent's context takes; read_file carries bigger files.
	MaxResultBytes = 1 << 20
	// RunJSTimeout is how long a script may run; a caller's earlier deadline wins.
	RunJSTimeout = 30 * time.Second
)

// startTimeout bounds how long Start waits for the display and DevTools to answer: Chromium
// on a cold, busy machine under gVisor takes seconds.
const startTimeout = 90 * time.Second

// startScript starts (once) Xvfb, the window manager and Chromium, each in its own session
// so that they outlive the exec, then waits until the display and DevTools answer. A
// process counts as running only when its pid file (in stateDir, of this life only) names a
// live process with the expected command line, or one whose command line reads empty since it
// is in the middle of an exec (a loaded host's start once failed there, "Xvfb exited" with
// nothing in its log). The X lock and Chromium's singleton files
// are on the disk, so a fresh start removes them. Each probe is bounded (xwd by timeout, the
// ping by its own), so that the script gives up at its end time rather than hang.
//
// No process may bind a Unix socket on the disk (/tmp, /root, /workspace are host
// directories): gVisor cannot checkpoint a socket bound on a host file system, and a sleep is
// a checkpoint. So Xvfb listens on its abstract socket only (-nolisten unix), and Chromium's
// TMPDIR (where its profile's SingletonSocket lives) is /dev/shm, a tmpfs inside the sandbox.
// Nor may any process listen on TCP (this gVisor cannot checkpoint a TCP listener that is
// waited on): Chromium's DevTools are a pipe, served on an abstract socket by RelayMain. Nor
// may a process keep a deleted file of the disk open (gVisor cannot save it): Chromium's
// persistent histograms (BrowserMetrics/*.pma in the profile, deleted while mapped) go to
// /dev/shm through a symlink.
func startScript(waitS int) string {
	return fmt.Sprintf(`set -u
S=%[1]s; mkdir -p "$S" %[2]s %[3]s # %[2]s: /data/memory, through the /data symlink
export DISPLAY=%[4]s HOME=/root
end=$(( $(date +%%s) + %[8]d ))
late() { [ "$(date +%%s)" -ge $end ]; }
P=/proc
%[12]s
if ! running xvfb Xvfb; then
  rm -f /tmp/.X0-lock /tmp/.X11-unix/X0
  launch xvfb /usr/bin/Xvfb %[4]s -screen 0 %[5]dx%[6]dx24 -nolisten tcp -nolisten unix -noreset -dpi 96
fi
until timeout 10 xwd -root -silent >/dev/null 2>&1; do
  late && { echo "the display did not answer within %[8]d s:"; tail -n 20 "$S/xvfb.log"; exit 1; }
  running xvfb Xvfb || { exited xvfb Xvfb; exit 1; }
  sleep 0.1
done
echo "the display answers"
running wm matchbox || launch wm /usr/bin/matchbox-window-manager -use_titlebar no
if ! running chromium %[9]s; then
  rm -rf %[3]s/SingletonLock %[3]s/SingletonSocket %[3]s/SingletonCookie %[3]s/BrowserMetrics
  mkdir -p /dev/shm/BrowserMetrics && ln -s /dev/shm/BrowserMetrics %[3]s/BrowserMetrics
  launch chromium env TMPDIR=/dev/shm %[10]s agent %[9]s /usr/lib/chromium/chromium --no-sandbox \
    --no-first-run --no-default-browser-check --user-data-dir=%[3]s \
    --disable-gpu --password-store=basic --disable-breakpad \
    --noerrdialogs --test-type --window-position=0,0 --window-size=%[5]d,%[6]d --start-maximized about:blank
fi
until %[10]s agent %[11]s --ping >/dev/null 2>"$S/ping.log"; do
  late && { echo "Chromium's DevTools did not answer within %[8]d s:"; tail -n 5 "$S/chromium.log"; cat "$S/ping.log"; exit 1; }
  running chromium %[9]s || { exited chromium Chromium; exit 1; }
  sleep 0.2
done
`, stateDir, templates.DesktopDataTarget+"/memory", ProfileDir, Display, Width, Height, 0, waitS, RelayCommand, hypervisor.GuestAgentBin, EvalCommand, processes)
}

// processes are startScript's shell functions for its processes, in state directory $S,
// with their pid files and logs there; /proc is $P.
//   - running NAME MATCH: NAME's pid file names a live process whose command line has MATCH,
//     or one in the middle of an exec (setsid's of the program), whose command line reads
//     empty; a dead one (a zombie's command line reads empty too) does not count. The command
//     line is read once: read twice (a match, then emptiness), an exec that ended between the
//     reads made a live Xvfb count as exited, and exited's wait for it outlasted the setup.
//   - launch NAME ARGV...: starts ARGV in a session of its own, for its pid file and log.
//   - exited NAME LABEL: says LABEL exited, with its exit status when this shell launched it
//     (a signal's shows as 128+N), and the tail of its log. It waits only for a process that
//     is gone or a zombie: one that lives after all (running was wrong) is named with its
//     state and command line, where a wait for it lasted until the exec's timeout.
const processes = `running() {
  p=$(cat "$S/$1.pid" 2>/dev/null) && [ -n "$p" ] || return 1
  c=$(tr '\0' ' ' 2>/dev/null <"$P/$p/cmdline")
  case $c in
  *"$2"*) return 0 ;;
  "") read -r _ _ st _ 2>/dev/null <"$P/$p/stat" && [ "$st" != Z ] && [ "$st" != X ] ;;
  *) return 1 ;;
  esac
}
launch() { n=$1; shift; setsid "$@" </dev/null >"$S/$n.log" 2>&1 & echo $! >"$S/$n.pid"; }
exited() {
  p=$(cat "$S/$1.pid" 2>/dev/null); st=
  read -r _ _ st _ 2>/dev/null <"$P/$p/stat" || :
  case $st in
  "" | Z | X) wait "$p" 2>/dev/null; echo "$2 exited (status $?):" ;;
  *) echo "$2 is not running as launched: pid $p is in state $st, running $(tr '\0' ' ' 2>/dev/null <"$P/$p/cmdline"):" ;;
  esac
  tail -n 20 "$S/$1.log"
}`

// Start launches the display, the window manager and the browser when they are not running
// (it is idempotent) and returns once the display and the browser's DevTools answer.
func Start(ctx context.Context, ex Execer) error {
	wait := startTimeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
		wait = time.Until(d)
	}
	stdout, stderr, code, err := ex.Exec(ctx, []string{"/bin/sh", "-c", startScript(max(1, int(wait/time.Second)))}, nil)
	if err != nil {
		// What the script said before (a timeout's exec answers its output so far): how far
		// it got.
		if said := tail(stdout, stderr); said != "" {
			return fmt.Errorf("desktop: start: %w; it said: %s", err, said)
		}
		return fmt.Errorf("desktop: start: %w", err)
	}
	if code != 0 {
		return fmt.Errorf("desktop: start (exit %d): %s", code, tail(stdout, stderr))
	}
	return nil
}

// Screenshot returns a PNG of the whole display. The guest sends an XWD dump, gzipped (a
// desktop is mostly flat colour); the host decodes it within bounds and encodes the PNG.
func Screenshot(ctx context.Context, ex Execer) ([]byte, error) {
	var stdout []byte
	for attempt := 1; ; attempt++ {
		out, stderr, code, err := ex.Exec(ctx, []string{"/bin/sh", "-c", "set -o pipefail; xwd -root -silent -display " + Display + " | gzip -1"}, nil)
		if err != nil {
			return nil, fmt.Errorf("desktop: screenshot: %w", err)
		}
		if code == 0 {
			stdout = out
			break
		}
		// xwd walks the windows for their colour maps: one that goes meanwhile (a menu, a
		// browser context's window) fails it with BadWindow. The next look does not see it.
		if attempt < 3 && bytes.Contains(stderr, []byte("BadWindow")) {
			continue
		}
		return nil, fmt.Errorf("desktop: screenshot (exit %d; is the desktop started?): %s", code, tail(nil, stderr))
	}
	zr, err := gzip.NewReader(bytes.NewReader(stdout))
	if err != nil {
		return nil, fmt.Errorf("desktop: screenshot: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, maxXWDBytes+1))
	if err != nil {
		return nil, fmt.Errorf("desktop: screenshot: %w", err)
	}
	img, err := decodeXWD(raw)
	if err != nil {
		return nil, fmt.Errorf("desktop: screenshot: %w", err)
	}
	return encodePNG(img)
}

// JSError is a script's exception (or its timeout) as the browser reports it.
type JSError struct {
	Message string // e.g. "Uncaught Error: boom" or "Execution was terminated"
	Line    int    // 1-based line of the script; 0 when unknown
	Column  int    // 1-based
	Timeout bool   // the script ran out of time
}

func (e *JSError) Error() string {
	switch {
	case e.Timeout:
		return "run_js: the script did not finish in time: " + e.Message
	case e.Line > 0:
		return fmt.Sprintf("run_js: line %d, column %d: %s", e.Line, e.Column, e.Message)
	}
	return "run_js: " + e.Message
}

// CheckRunJS answers RunJS's error for script and limit when they are not what it takes, nil
// when they are: a caller can refuse them before it wakes a desktop to run them.
func CheckRunJS(script string, limit time.Duration) error {
	if len(script) > MaxScriptBytes {
		return fmt.Errorf("run_js: script is %d bytes; at most %d", len(script), MaxScriptBytes)
	}
	if strings.TrimSpace(script) == "" {
		return errors.New("run_js: script is empty")
	}
	if limit != 0 && (limit < time.Millisecond || limit > RunJSTimeout) {
		return fmt.Errorf("run_js: the time limit must be 1 ms to %s, got %s", RunJSTimeout, limit)
	}
	return nil
}

// RunJS evaluates script in the desktop's browser in a browser context of its own (nothing
// is kept between calls) and returns its value as JSON (a promise is awaited; undefined is
// null). The script may run for limit (0: RunJSTimeout, its most), and for no longer than
// ctx's deadline less 5 s. A script that throws or runs out of time is a *JSError.
func RunJS(ctx context.Context, ex Execer, script string, limit time.Duration) (json.RawMessage, error) {
	if err := CheckRunJS(script, limit); err != nil {
		return nil, err
	}
	if limit == 0 {
		limit = RunJSTimeout
	}
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d) - 5*time.Second // room to tear the context down and answer
		if left < min(limit, time.Second) {
			return nil, errors.New("run_js: less than 6 s left before the call's deadline")
		}
		limit = min(limit, left)
	}
	argv := []string{hypervisor.GuestAgentBin, "agent", EvalCommand, "--timeout-ms", strconv.FormatInt(limit.Milliseconds(), 10)}
	stdout, stderr, code, err := ex.Exec(ctx, argv, []byte(script))
	if err != nil {
		return nil, fmt.Errorf("run_js: %w", err)
	}
	if code != 0 {
		return nil, fmt.Errorf("run_js (exit %d; is the desktop started?): %s", code, tail(stdout, stderr))
	}
	return parseEvalOutput(stdout)
}

// parseEvalOutput reads what EvalMain printed.
func parseEvalOutput(b []byte) (json.RawMessage, error) {
	if len(b) > MaxResultBytes+4096 {
		return nil, fmt.Errorf("run_js: the answer is %d bytes; at most %d", len(b), MaxResultBytes)
	}
	var out evalOutput
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("run_js: unreadable answer from the guest: %w", err)
	}
	if out.Error != nil {
		return nil, out.Error.jsError()
	}
	if len(out.Value) == 0 {
		return json.RawMessage("null"), nil
	}
	return out.Value, nil
}

// tail is the last lines of a failed command's output, for an error message.
func tail(stdout, stderr []byte) string {
	s := strings.TrimSpace(string(stdout) + "\n" + string(stderr))
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	return s
}
