package guest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/desktop/guest"
	"wb/hypervisor"
)

// screenColours decodes a screenshot, checks its size, and counts its distinct colours.
func screenColours(t *testing.T, b []byte) int {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if img.Bounds() != image.Rect(0, 0, guest.Width, guest.Height) {
		t.Fatalf("screenshot is %v, want %dx%d", img.Bounds(), guest.Width, guest.Height)
	}
	seen := map[[4]uint32]bool{}
	for y := 0; y < guest.Height; y += 2 {
		for x := 0; x < guest.Width; x += 2 {
			r, g, b, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, b, a}] = true
		}
	}
	return len(seen)
}

// awaitDrawn takes screenshots until Chromium has drawn its window (many colours: text,
// icons), or fails after a minute.
func awaitDrawn(ctx context.Context, t *testing.T, ex guest.Execer) []byte {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := guest.Screenshot(ctx, ex)
		if err != nil {
			t.Fatal(err)
		}
		n := screenColours(t, b)
		if n >= 16 {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("the display still shows %d colours a minute after Start: Chromium did not draw", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pids is the pid files of the desktop's processes, as the guest has them.
func pids(ctx context.Context, t *testing.T, ex guest.Execer) string {
	t.Helper()
	out, stderr, code, err := ex.Exec(ctx, []string{"/bin/sh", "-c", "cd /dev/shm/wb-desktop && cat xvfb.pid wm.pid chromium.pid"}, nil)
	if err != nil || code != 0 {
		t.Fatalf("pid files: %v %d %s", err, code, stderr)
	}
	return strings.Join(strings.Fields(string(out)), " ")
}

func runJS(ctx context.Context, t *testing.T, ex guest.Execer, script string) string {
	t.Helper()
	t0 := time.Now()
	v, err := guest.RunJS(ctx, ex, script, 0)
	if err != nil {
		t.Fatalf("RunJS(%q): %v", script, err)
	}
	t.Logf("run_js %q: %s", script, time.Since(t0))
	return string(v)
}

// TestDesktopGuest starts a desktop in gVisor and drives it as the desktop API does.
func TestDesktopGuest(t *testing.T) {
	e := newEnv(t, "runsc")
	ctx := ctxT(t, 10*time.Minute) // the whole test; a cold, busy machine starts Chromium slowly
	g := e.boot(ctx)
	t0 := time.Now()
	if err := guest.Start(ctx, g.ex); err != nil {
		t.Fatal(err)
	}
	t.Logf("Start: %s", time.Since(t0))
	before := pids(ctx, t, g.ex)
	if err := guest.Start(ctx, g.ex); err != nil {
		t.Fatal(err)
	}
	if after := pids(ctx, t, g.ex); after != before {
		t.Fatalf("a second Start relaunched the desktop: pids %s → %s", before, after)
	}

	t.Run("screenshot", func(t *testing.T) {
		shot := awaitDrawn(ctx, t, g.ex)
		if dir := os.Getenv("WB_ARTIFACTS"); dir != "" {
			_ = os.WriteFile(filepath.Join(dir, "desktop.png"), shot, 0o644)
		}
		t.Logf("screenshot: %d bytes of PNG", len(shot))
	})

	t.Run("memory at rest", func(t *testing.T) {
		st, err := e.d.Stats(ctx, g.spec.ID)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("a started desktop guest uses %d MiB (cgroup memory, sandbox included)", st.MemoryBytes>>20)
	})

	t.Run("disk", func(t *testing.T) {
		// /data/memory and the browser profile are on the writable disk: what stop keeps.
		for _, p := range []string{
			filepath.Join(hypervisor.WorkspaceDir(g.spec.Writable), "data", "memory"),
			filepath.Join(g.spec.Writable, "root", ".config", "chromium", "Local State"),
		} {
			if _, err := os.Stat(p); err != nil {
				t.Errorf("not on the disk: %v", err)
			}
		}
		out, _, code, err := g.ex.Exec(ctx, []string{"/bin/sh", "-c", "echo kept > /data/memory/note && cat /workspace/data/memory/note"}, nil)
		if err != nil || code != 0 || string(out) != "kept\n" {
			t.Errorf("write to /data/memory: %q %d %v", out, code, err)
		}
	})

	t.Run("run_js", func(t *testing.T) {
		if got := runJS(ctx, t, g.ex, "1+1"); got != "2" {
			t.Errorf("1+1 = %s", got)
		}
		if got := runJS(ctx, t, g.ex, "Promise.resolve({a: [1, 'x']})"); got != `{"a":[1,"x"]}` {
			t.Errorf("promise = %s", got)
		}
		if got := runJS(ctx, t, g.ex, "undefined"); got != "null" {
			t.Errorf("undefined = %s", got)
		}
		// The spare browser context the relay keeps between calls is not shown: the display
		// still shows the browser's window, not a blank page.
		shot, err := guest.Screenshot(ctx, g.ex)
		if err != nil {
			t.Fatal(err)
		}
		if n := screenColours(t, shot); n < 16 {
			t.Errorf("after run_js, the display shows %d colours: a blank page covers the browser", n)
		}
	})

	t.Run("fresh context per call", func(t *testing.T) {
		if got := runJS(ctx, t, g.ex, "globalThis.leak = 42; leak"); got != "42" {
			t.Fatalf("set = %s", got)
		}
		if got := runJS(ctx, t, g.ex, "typeof globalThis.leak"); got != `"undefined"` {
			t.Errorf("the next call sees %s: state was kept between calls", got)
		}
	})

	t.Run("exception", func(t *testing.T) {
		_, err := guest.RunJS(ctx, g.ex, "const a = 1;\nthrow new Error('boom')", 0)
		var je *guest.JSError
		if !errors.As(err, &je) || je.Line != 2 || !strings.Contains(je.Message, "Error: boom") || je.Timeout {
			t.Fatalf("err = %#v (%v), want a JSError on line 2 with Error: boom", je, err)
		}
		t.Logf("a throwing script: %v", err)
	})

	t.Run("endless loop", func(t *testing.T) {
		// 2 s for the script (spinning a core all the while); a loaded machine answers late.
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		t0 := time.Now()
		_, err := guest.RunJS(lctx, g.ex, "while (true) {}", 2*time.Second)
		var je *guest.JSError
		if !errors.As(err, &je) || !je.Timeout {
			t.Fatalf("err = %v, want a timeout JSError", err)
		}
		t.Logf("an endless loop: %v after %s", err, time.Since(t0))
		if got := runJS(ctx, t, g.ex, "1+1"); got != "2" {
			t.Errorf("after the loop, 1+1 = %s", got)
		}
	})

	t.Run("bounds", func(t *testing.T) {
		if _, err := guest.RunJS(ctx, g.ex, strings.Repeat(" ", guest.MaxScriptBytes+1), 0); err == nil || !strings.Contains(err.Error(), "at most") {
			t.Errorf("oversized script: %v", err)
		}
		// Its JSON is the string and its two quotes: 3 bytes past the bound.
		_, err := guest.RunJS(ctx, g.ex, fmt.Sprintf("'x'.repeat(%d)", guest.MaxResultBytes+1), 0)
		if err == nil || !strings.Contains(err.Error(), "result") {
			t.Errorf("oversized result: %v", err)
		}
		t.Logf("an oversized result: %v", err)
	})
}

// TestDesktopStartAfterAnEarlierLife starts a desktop on a disk that an earlier life left
// pid files on, each naming a live process whose command line matches (as a pid handed out
// again does): Start must launch the display and browser all the same.
func TestDesktopStartAfterAnEarlierLife(t *testing.T) {
	e := newEnv(t, "runc")
	ctx := ctxT(t, 5*time.Minute)
	g := e.boot(ctx)
	decoy := `mkdir -p /tmp/wb-desktop && for n in xvfb wm chromium; do
  setsid sh -c 'sleep 600; : Xvfb matchbox ` + guest.RelayCommand + `' </dev/null >/dev/null 2>&1 & echo $! > /tmp/wb-desktop/$n.pid
done`
	if out, stderr, code, err := g.ex.Exec(ctx, []string{"/bin/sh", "-c", decoy}, nil); err != nil || code != 0 {
		t.Fatalf("decoys: %v %d %s %s", err, code, out, stderr)
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := guest.Start(sctx, g.ex); err != nil {
		t.Fatalf("Start beside an earlier life's pid files: %v", err)
	}
	if b, err := guest.Screenshot(ctx, g.ex); err != nil || len(b) == 0 {
		t.Fatalf("no display after Start: %v", err)
	}
}

// TestDesktopCheckpointRestore is what a desktop's sleep relies on: a running desktop is
// checkpointed with its memory (runsc) and restored into a new guest, and its display and
// browser answer there as the same processes, without Start.
func TestDesktopCheckpointRestore(t *testing.T) {
	e := newEnv(t, "runsc")
	ctx := ctxT(t, 10*time.Minute)
	g := e.boot(ctx)
	if err := guest.Start(ctx, g.ex); err != nil {
		t.Fatal(err)
	}
	awaitDrawn(ctx, t, g.ex)
	before := pids(ctx, t, g.ex)
	// What made gVisor's checkpoint fail: a Unix socket bound on a host directory.
	if out, _, _, err := g.ex.Exec(ctx, []string{"/bin/sh", "-c", "find /tmp /root /workspace -type s"}, nil); err != nil || len(out) > 0 {
		t.Errorf("sockets on the disk: %q %v", out, err)
	}

	dir := filepath.Join(t.TempDir(), "snap")
	// As the node does: the agent lets go of its host socket while the guest is checkpointed,
	// until the restored guest's host puts the resume file beside its socket (without it the
	// restored agent answered only once the 45 s were over).
	const resume = "resume-desktop"
	if err := g.agent.QuiesceUntil(ctx, 45*time.Second, resume); err != nil {
		t.Fatal(err)
	}
	g.agent.Close()
	t0 := time.Now()
	si, err := e.d.Snapshot(ctx, g.spec.ID, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if !si.Memory {
		t.Fatalf("snapshot %+v holds no memory", si)
	}
	t.Logf("checkpoint: %s, %d MiB", time.Since(t0), si.SizeBytes>>20)

	r := e.spec()
	e.track(r)
	t0 = time.Now()
	if err := e.d.Restore(ctx, r, dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.AgentDir, resume), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rg := e.attach(ctx, r)
	t.Logf("restore to an answering agent: %s", time.Since(t0))
	if after := pids(ctx, t, rg.ex); after != before {
		t.Fatalf("pids %s after restore, %s before", after, before)
	}
	awaitDrawn(ctx, t, rg.ex)
	if got := runJS(ctx, t, rg.ex, "1+1"); got != "2" {
		t.Errorf("after restore, 1+1 = %s", got)
	}
	t.Logf("Xvfb and Chromium answer %s after the restore began", time.Since(t0))
	if err := guest.Start(ctx, rg.ex); err != nil {
		t.Fatal(err)
	}
	if after := pids(ctx, t, rg.ex); after != before {
		t.Fatalf("Start after a restore relaunched the desktop: pids %s → %s", before, after)
	}
}
