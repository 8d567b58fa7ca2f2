package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"image/png"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/desktop"
	"wb/internal/fakenode"
	"wb/session"
)

// bashNode is the fake node with the guest's /bin/sh played by bash: the screenshot's
// pipeline needs pipefail, which this host's /bin/sh (dash) lacks.
type bashNode struct{ *fakenode.Node }

func (n bashNode) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, argv []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	if len(argv) > 0 && argv[0] == "/bin/sh" {
		argv = append([]string{"/bin/bash"}, argv[1:]...)
		req.Command, _ = json.Marshal(argv)
	}
	return n.Node.Exec(ctx, s, req, argv, out)
}

// fakeXWD puts an xwd on the PATH of the fake node's agent (it runs commands on this host)
// that prints a real Xvfb dump, or fails while the file it answers names exists.
func fakeXWD(t *testing.T) (failFlag string) {
	t.Helper()
	dump, err := filepath.Abs("../desktop/guest/testdata/xvfb-40x30x24.xwd")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	failFlag = filepath.Join(dir, "fail")
	script := "#!/bin/sh\n[ -e " + failFlag + " ] && { echo 'cannot open display' >&2; exit 1; }\nexec cat " + dump + "\n"
	if err := os.WriteFile(filepath.Join(dir, "xwd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return failFlag
}

// TestDesktopScreen: a running desktop's screen is a PNG of its display, read through its
// session; looking is no use (last_used_at stays); a desktop that is not running answers 409
// naming its state and is not woken; a display that cannot be read answers 502.
func TestDesktopScreen(t *testing.T) {
	failFlag := fakeXWD(t)
	e := newEnv(t, func(c *Config) { c.Guests = bashNode{c.Guests.(*fakenode.Node)} })
	d := e.newDesktop(map[string]any{"name": "screen"})
	before := e.desktop(d.ID).LastUsedAt

	r := e.mustDo("GET", "/v1/desktops/"+d.ID+"/screen", e.key, nil, 200, nil)
	if ct := r.header.Get("Content-Type"); ct != "image/png" {
		t.Fatalf("Content-Type %q", ct)
	}
	img, err := png.Decode(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 40 || b.Dy() != 30 {
		t.Fatalf("screen is %v, want the dump's 40×30", b)
	}
	if after := e.desktop(d.ID).LastUsedAt; after == nil || before == nil || !after.Equal(before.Time) {
		t.Errorf("the screen counted as a use: last_used_at %v, was %v", after, before)
	}

	if err := os.WriteFile(failFlag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg := expectError(t, e.do("GET", "/v1/desktops/"+d.ID+"/screen", e.key, nil), 502, "screen_unavailable", ""); !strings.Contains(msg, "cannot open display") {
		t.Errorf("502 message %q does not say why", msg)
	}

	e.desktopAction(d.ID, "sleep", 202)
	e.waitDesktop(d.ID, desktop.Asleep)
	msg := expectError(t, e.do("GET", "/v1/desktops/"+d.ID+"/screen", e.key, nil), 409, "invalid_state", "")
	if !strings.Contains(msg, "asleep") {
		t.Errorf("409 message %q does not name the state", msg)
	}
	if got := e.desktop(d.ID); got.State != desktop.Asleep {
		t.Fatalf("the screen of an asleep desktop moved it to %s", got.State)
	}
	expectError(t, e.do("GET", "/v1/desktops/desk_none/screen", e.key, nil), 404, "not_found", "")
}

// TestDesktopHeartbeat: heartbeats keep a running desktop awake past its idle time; once
// they stop it falls asleep; a heartbeat to an asleep desktop answers it asleep and leaves it
// so.
func TestDesktopHeartbeat(t *testing.T) {
	const idle = 2 * time.Second
	e := newEnv(t, func(c *Config) { c.DesktopIdle = idle })
	d := e.newDesktop(map[string]any{"name": "beat"})
	for until := time.Now().Add(2 * idle); time.Now().Before(until); time.Sleep(idle / 10) {
		var got desktop.Desktop
		e.mustDo("POST", "/v1/desktops/"+d.ID+"/heartbeat", e.key, nil, 200, &got)
		if got.State != desktop.Running || got.ID != d.ID {
			t.Fatalf("heartbeat answered %+v", got)
		}
	}
	t0 := time.Now()
	e.waitDesktop(d.ID, desktop.Asleep)
	if el := time.Since(t0); el < idle/2 {
		t.Errorf("fell asleep %v after the last heartbeat; idle is %v", el, idle)
	}
	var got desktop.Desktop
	e.mustDo("POST", "/v1/desktops/"+d.ID+"/heartbeat", e.key, map[string]any{}, 200, &got)
	if got.State != desktop.Asleep {
		t.Fatalf("heartbeat to an asleep desktop answered %s", got.State)
	}
	if cur := e.desktop(d.ID); cur.State != desktop.Asleep {
		t.Fatalf("a heartbeat moved an asleep desktop to %s", cur.State)
	}
	expectError(t, e.do("POST", "/v1/desktops/"+d.ID+"/heartbeat", e.key, map[string]any{"x": 1}), 400, "invalid_request", "*")
	expectError(t, e.do("POST", "/v1/desktops/desk_none/heartbeat", e.key, nil), 404, "not_found", "")
}

// TestConsoleMounted: the gateway serves the web console under /console/ (and /console
// redirects there) without a key: the pages hold none; their scripts send the user's.
func TestConsoleMounted(t *testing.T) {
	e := newEnv(t)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(e.url + "/console")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if (resp.StatusCode != http.StatusMovedPermanently && resp.StatusCode != http.StatusTemporaryRedirect) || resp.Header.Get("Location") != "/console/" {
		t.Fatalf("GET /console: %d to %q, want a redirect to /console/", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, err = http.Get(e.url + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `<form id="signin"`) {
		t.Fatalf("GET /console/: %d %.200s", resp.StatusCode, b)
	}
}

// fakeNoisyXWD puts an xwd on the PATH of the fake node's agent that prints a dump of a
// whole screen of noise (the real Xvfb dump's header, resized), whose PNG is megabytes.
func fakeNoisyXWD(t *testing.T) {
	t.Helper()
	dump, err := os.ReadFile("../desktop/guest/testdata/xvfb-40x30x24.xwd")
	if err != nil {
		t.Fatal(err)
	}
	field := func(i int) uint32 { return binary.BigEndian.Uint32(dump[4*i:]) }
	set := func(b []byte, i int, v uint32) { binary.BigEndian.PutUint32(b[4*i:], v) }
	const width, height = 1280, 800
	bpp := field(11) / 8
	start := field(0) + field(19)*12 // the header, the window's name, the colour map
	b := append([]byte(nil), dump[:start]...)
	set(b, 4, width)
	set(b, 5, height)
	set(b, 12, width*bpp)
	set(b, 20, width)
	set(b, 21, height)
	noise := make([]byte, width*height*bpp)
	_, _ = rand.Read(noise)
	b = append(b, noise...)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "screen.xwd"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\nexec cat " + filepath.Join(dir, "screen.xwd") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "xwd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// TestDesktopScreenStalledCallerIsCut: a screenshot whose caller stays connected but takes
// none of it ends once a write to it waited WriteStall, and lets go of the project's
// file-call slot (and the PNG's megabytes). Before, such a caller (asking for a few on one
// connection, whose buffers fill with the first) held both for as long as it stayed.
func TestDesktopScreenStalledCallerIsCut(t *testing.T) {
	fakeNoisyXWD(t)
	e := newEnv(t, func(c *Config) {
		c.Guests = bashNode{c.Guests.(*fakenode.Node)}
		c.MaxConcurrentFileCalls = 1
		c.WriteStall = 3 * time.Second
	})
	d := e.newDesktop(map[string]any{"name": "screen"})
	// A few, pipelined: the sockets' buffers may hold a whole PNG or two.
	stalledRead(t, e.srv.Listener.Addr().String(), e.key, "/v1/desktops/"+d.ID+"/screen", 4)
	// The caller now reads no more, and stays: the next call waits for the cap's one slot.
	deadline := time.Now().Add(45 * time.Second)
	for {
		r := e.do("GET", "/v1/desktops/"+d.ID+"/files?path=.&list=1", e.key, nil)
		if r.status == 200 {
			break
		}
		if r.status != 429 {
			t.Fatalf("GET files?list=1: %d %s; want a 429 until the stalled screenshot ends, then a 200", r.status, r.body)
		}
		if time.Now().After(deadline) {
			t.Fatal("45 s after its caller stopped reading, the screenshot still held the project's one file-call slot; want it ended after the 3 s stall")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
