package desktop_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"image/png"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"wb/desktop"
	"wb/gateway"
	"wb/node"
	"wb/session"
)

// The web console (wb/console) in headless Chromium against the whole engine with real runsc
// guests. The desktops run tpl_base, whose "screen" is an XWD dump that the desktop's setup
// writes to its disk and that the screenshot command reads back (screenFromDisk): the
// console's screen then travels the real path (API, session exec in the guest, XWD → PNG)
// without waiting for Chromium to start inside the guest, which is not what these tests test.

// screenFile is where the fake desktop keeps its screen.
const screenFile = "/workspace/screen.xwd"

// screenFromDisk plays the desktop's display: the screenshot's `xwd -root` becomes a read of
// screenFile in the same guest.
type screenFromDisk struct{ *node.Local }

func (g screenFromDisk) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, argv []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	if len(argv) == 3 && strings.Contains(argv[2], "xwd -root") {
		argv = []string{"/bin/sh", "-c", "gzip -1 < " + screenFile}
		req.Command, _ = json.Marshal(argv)
	}
	return g.Local.Exec(ctx, s, req, argv, out)
}

// fakeScreen is a desktop's setup that writes its screen (a small drawn "desktop") to its disk.
func fakeScreen(ctx context.Context, ex desktop.Execer) error {
	_, stderr, code, err := ex.Exec(ctx, []string{"/bin/sh", "-c", "cat > " + screenFile}, drawnXWD(320, 200))
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("write the screen: exit %d: %s", code, stderr)
	}
	return nil
}

// drawnXWD is an XWD dump (ZPixmap, TrueColor, 32 bits a pixel, as Xvfb writes at depth 24)
// of a blue desktop with a white window and a title bar.
func drawnXWD(w, h int) []byte {
	var b bytes.Buffer
	hdr := []uint32{100, 7, 2, 24, uint32(w), uint32(h), 0, 0, 32, 0, 32, 32, uint32(w * 4), 4,
		0xff0000, 0xff00, 0xff, 8, 0, 0, uint32(w), uint32(h), 0, 0, 0}
	_ = binary.Write(&b, binary.BigEndian, hdr)
	for y := range h {
		for x := range w {
			px := uint32(0x20+x/16)<<16 | uint32(0x50+y/8)<<8 | 0x90 // the background: a gradient
			inWindow := x > w/8 && x < w*7/8 && y > h/6 && y < h*5/6
			switch {
			case inWindow && y < h/6+12:
				px = 0x303a50 // title bar
			case inWindow:
				px = 0xf4f4f4
			}
			_ = binary.Write(&b, binary.LittleEndian, px)
		}
	}
	return b.Bytes()
}

func withConsoleScreen(c *gateway.Config) {
	c.Guests = screenFromDisk{c.Guests.(*node.Local)}
	c.DesktopSetup = fakeScreen
}

// browser starts a headless Chromium for the test, or skips the test when there is none.
func browser(t *testing.T) context.Context {
	t.Helper()
	exe := ""
	for _, p := range []string{"/usr/lib/chromium/chromium", "/usr/bin/chromium"} {
		if _, err := os.Stat(p); err == nil {
			exe = p
			break
		}
	}
	if exe == "" {
		t.Skip("no Chromium (/usr/bin/chromium): scripts/deps.sh installs Debian's chromium package")
	}
	// Chromium leaves its singleton directory (org.chromium.Chromium.*) in $TMPDIR: one of the
	// test's own, removed after the browser stops (cleanups run last first).
	tmp, err := os.MkdirTemp("", "wbchrome-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.WindowSize(1280, 1000),
		chromedp.Env("TMPDIR="+tmp))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first run starts the browser; it must not carry a deadline (it would end the
	// browser), so the deadline is on the step's context only.
	start := make(chan error, 1)
	go func() { start <- chromedp.Do(ctx) }()
	select {
	case err := <-start:
		if err != nil {
			t.Fatalf("start Chromium: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Chromium did not start within 2 minutes")
	}
	return ctx
}

// step runs steps in the browser, each call with its own deadline.
func step(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(sctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// awaitJS polls the page until expr is true, within timeout.
func awaitJS(t *testing.T, ctx context.Context, what, expr string, timeout time.Duration) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := chromedp.Run(sctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(timeout))); err != nil {
		t.Fatalf("%s (%s): %v; the page shows state %q, error %q", what, expr, err,
			eval[string](t, ctx, `(document.getElementById("state")||{}).textContent||""`),
			eval[string](t, ctx, `(document.getElementById("error")||{}).textContent||""`))
	}
}

// signIn opens the console and signs in with key, first showing that a wrong key gets the
// API's own message.
func signIn(t *testing.T, ctx context.Context, base, key string) {
	t.Helper()
	// A cold make test's navigation once never ended (its step's 90 s ran out, and which of
	// its actions hung is unknown): the page is opened again, up to three times, each given
	// 30 s, and what the page was doing is logged.
	opened := false
	for attempt := 1; attempt <= 3 && !opened; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := chromedp.Do(actx, chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("key")))
		cancel()
		if opened = err == nil; !opened {
			t.Logf("open the console, attempt %d: %v (at %s, %s)", attempt, err,
				eval[string](t, ctx, `location.href`), eval[string](t, ctx, `document.readyState`))
		}
	}
	if !opened {
		t.Fatal("open the console: three navigations did not show the sign-in form")
	}
	step(t, ctx, "sign in with a wrong key",
		chromedp.SendKeys(chromedp.ID("key"), "wb_live_wrong"),
		chromedp.Click(chromedp.ID("signin-button")),
	)
	awaitJS(t, ctx, "a wrong key is refused with the API's message",
		`!document.getElementById("error").hidden && document.getElementById("error").textContent.includes("unknown API key")`, 30*time.Second)
	step(t, ctx, "sign in",
		chromedp.Evaluate[chromedp.Void](`document.getElementById("key").value = ""`),
		chromedp.SendKeys(chromedp.ID("key"), key),
		chromedp.Click(chromedp.ID("signin-button")),
		chromedp.WaitVisible(chromedp.ID("overview")),
	)
	if got := eval[string](t, ctx, `sessionStorage.getItem("wb_api_key")`); got != key {
		t.Fatalf("sessionStorage holds %q after signing in", got)
	}
	if shown := eval[bool](t, ctx, `document.getElementById("signin").offsetParent !== null`); shown {
		t.Error("signed in, the page still shows the sign-in form")
	}
}

// saveScreenshot takes the page's screenshot, checks that it is an image of the page's size,
// and writes it under $WB_TEST_ARTIFACTS when that is set (for a person to look at; without
// it nothing is left behind: every make test once left three in /tmp).
func saveScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	buf, err := chromedp.Run(sctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	width, height := eval[int](t, ctx, `window.innerWidth`), eval[int](t, ctx, `window.innerHeight`)
	cfg, err := png.DecodeConfig(bytes.NewReader(buf))
	if err != nil {
		t.Fatalf("the %s screenshot is not a PNG: %v", name, err)
	}
	if cfg.Width < width || cfg.Height < height {
		t.Errorf("the %s screenshot is %dx%d, the page %dx%d", name, cfg.Width, cfg.Height, width, height)
	}
	dir := os.Getenv("WB_TEST_ARTIFACTS")
	if dir == "" {
		t.Logf("screenshot of the console (%s, %dx%d): set WB_TEST_ARTIFACTS to keep it", name, cfg.Width, cfg.Height)
		return
	}
	art := filepath.Join(dir, name+".png")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(art, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the console: %s", art)
}

// TestConsoleSleepAndWake: sign in (a wrong key first), see the desktop and its session in
// the lists, open the desktop's page and see its live screen, press Sleep and see it asleep,
// press Wake and see it running again; a screenshot of the page is saved. The deployment's
// idle time is the default 15 minutes, so only the buttons move the desktop.
func TestConsoleSleepAndWake(t *testing.T) {
	t.Parallel()
	p := startPlatform(t, withConsoleScreen)
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "console desk"}, 201, &d)
	d = p.wait(d.ID, desktop.Running)
	sessions := []string{d.SessionID} // the desktop runs as a new session at each wake
	ctx := browser(t)
	signIn(t, ctx, p.url, p.key)

	row := fmt.Sprintf(`#desktops tr[data-id=%q]`, d.ID)
	awaitJS(t, ctx, "the desktop is listed, running",
		fmt.Sprintf(`(document.querySelector(%q)||{textContent:""}).textContent.includes("running")`, row), 30*time.Second)
	awaitJS(t, ctx, "its session is listed",
		fmt.Sprintf(`document.querySelector(%q) !== null`, fmt.Sprintf(`#sessions tr[data-id=%q]`, d.SessionID)), 30*time.Second)
	saveScreenshot(t, ctx, "console-overview")

	// The overview redraws its tables every 5 s, replacing the link under the pointer: a
	// click that lands mid-redraw is lost (a cold make test waited 90 s after one). A person
	// clicks again; so does the test, up to three times, each given 30 s to open the page.
	opened := false
	for attempt := 1; attempt <= 3 && !opened; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := chromedp.Do(actx, chromedp.Click(chromedp.CSS(row+" a.open")), chromedp.WaitVisible(chromedp.ID("state")))
		cancel()
		if opened = err == nil; !opened {
			t.Logf("open the desktop's page, attempt %d: %v (at %s)", attempt, err, eval[string](t, ctx, `location.href`))
		}
	}
	if !opened {
		t.Fatal("open the desktop's page: three clicks on its link did not open it")
	}
	if loc := eval[string](t, ctx, `location.pathname + location.search`); loc != "/console/desktop.html?id="+url.QueryEscape(d.ID) {
		t.Fatalf("the link opened %s", loc)
	}
	awaitJS(t, ctx, "the page shows it running", `document.getElementById("state").textContent === "running"`, 30*time.Second)
	awaitJS(t, ctx, "the page shows its screen",
		`!document.getElementById("screen").hidden && document.getElementById("screen").naturalWidth === 320`, 60*time.Second)
	if dis := eval[bool](t, ctx, `document.getElementById("wake").disabled && !document.getElementById("sleep").disabled`); !dis {
		t.Error("running: Wake should be disabled and Sleep enabled")
	}

	step(t, ctx, "press Sleep", chromedp.Click(chromedp.ID("sleep")))
	awaitJS(t, ctx, "after Sleep the page shows it asleep", `document.getElementById("state").textContent === "asleep"`, 3*time.Minute)
	p.call("GET", "/v1/desktops/"+d.ID, nil, 200, &d)
	if d.State != desktop.Asleep || !d.StateSaved {
		t.Fatalf("after Sleep the API says %s (state saved %v): %s", d.State, d.StateSaved, d.Message)
	}
	if eval[bool](t, ctx, `document.getElementById("screen").hidden`) != true {
		t.Error("asleep, the page still shows a screen")
	}

	step(t, ctx, "press Wake", chromedp.Click(chromedp.ID("wake")))
	awaitJS(t, ctx, "after Wake the page shows it running", `document.getElementById("state").textContent === "running"`, 3*time.Minute)
	awaitJS(t, ctx, "the screen is back", `!document.getElementById("screen").hidden`, 60*time.Second)
	p.call("GET", "/v1/desktops/"+d.ID, nil, 200, &d)
	if d.State != desktop.Running {
		t.Fatalf("after Wake the API says %s", d.State)
	}
	sessions = append(sessions, d.SessionID)
	saveScreenshot(t, ctx, "console-desktop")

	// Resize while running waits for the next start; the node has no room for xl, so Wake
	// then answers 409, which the page shows as the API's message, and the desktop stays.
	// Chosen as a person chooses it (the change event), which the page's 2 s poll must leave
	// alone: it reset a choice made just before the click, which then sent the current size.
	step(t, ctx, "choose xl", chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById("new-size"); s.value = "xl"; s.dispatchEvent(new Event("change")); })()`))
	time.Sleep(2500 * time.Millisecond) // a poll or two
	if got := eval[string](t, ctx, `document.getElementById("new-size").value`); got != "xl" {
		t.Fatalf("the page's poll reset the size chosen to %q", got)
	}
	step(t, ctx, "resize to xl", chromedp.Click(chromedp.ID("resize")))
	awaitJS(t, ctx, "the page shows the waiting resize", `document.getElementById("next-size").textContent.includes("xl from its next start")`, 30*time.Second)
	step(t, ctx, "press Sleep again", chromedp.Click(chromedp.ID("sleep")))
	awaitJS(t, ctx, "asleep without its state (a resize waited)", `document.getElementById("state").textContent === "asleep: state not saved"`, 3*time.Minute)
	awaitJS(t, ctx, "the new size", `document.getElementById("size").textContent === "xl"`, 30*time.Second)
	step(t, ctx, "press Wake with no room", chromedp.Click(chromedp.ID("wake")))
	awaitJS(t, ctx, "the API's 409 is shown", `!document.getElementById("error").hidden && document.getElementById("error").textContent.includes("no machine has room")`, 30*time.Second)
	p.call("GET", "/v1/desktops/"+d.ID, nil, 200, &d)
	if d.State != desktop.Asleep || d.Size != "xl" {
		t.Fatalf("after a refused wake the API says %s, size %s", d.State, d.Size)
	}

	// Asleep, the desktop's cost stops growing: the overview shows it as the sum of its two
	// sessions' costs in the usage report, once their last usage has settled.
	step(t, ctx, "back to the overview", chromedp.Navigate(p.url+"/console/"), chromedp.WaitVisible(chromedp.ID("overview")))
	checkDesktopCost(t, ctx, p, d.ID, sessions)

	step(t, ctx, "sign out", chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("signin")))
	if got := eval[string](t, ctx, `sessionStorage.getItem("wb_api_key") || ""`); got != "" {
		t.Errorf("after signing out sessionStorage still holds %q", got)
	}
}

// checkDesktopCost waits until the overview's cost of desktop id is the sum of the settled
// costs in GET /v1/usage of the desktop's sessions (those whose metadata names it: known, the
// ones the test saw, plus any a failed wake made), the known ones priced and labelled with
// the desktop, and the sum the same twice in a row (the last records settle a few seconds
// after the sleep; the page refreshes every 5 s).
func checkDesktopCost(t *testing.T, ctx context.Context, p *platform, id string, known []string) {
	t.Helper()
	var list struct {
		Data []session.Session `json:"data"`
	}
	p.call("GET", "/v1/sessions?limit=100", nil, 200, &list)
	ofDesktop := map[string]bool{}
	for _, s := range list.Data {
		if s.Metadata[session.DesktopMetadataKey] == id {
			ofDesktop[s.ID] = true
		}
	}
	for _, sid := range known {
		if !ofDesktop[sid] {
			t.Errorf("session %s of desktop %s does not carry %s=%s", sid, id, session.DesktopMetadataKey, id)
		}
	}
	cell := fmt.Sprintf(`#desktops tr[data-id=%q] td.cost`, id)
	var want int64
	var shown, last string
	var report []byte
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		var rep struct {
			Data []struct {
				SessionID string `json:"session_id"`
				DesktopID string `json:"desktop_id"`
				Cost      int64  `json:"cost_micro_usd"`
			} `json:"data"`
		}
		p.call("GET", "/v1/usage?group_by=session", nil, 200, &rep)
		report, _ = json.Marshal(rep.Data)
		cost := map[string]int64{}
		want = 0
		labelled := true
		for _, l := range rep.Data {
			if ofDesktop[l.SessionID] {
				cost[l.SessionID] = l.Cost
				want += l.Cost
				labelled = labelled && l.DesktopID == id
			}
		}
		priced := labelled
		for _, sid := range known {
			priced = priced && cost[sid] > 0
		}
		shown = eval[string](t, ctx, fmt.Sprintf(`(document.querySelector(%q)||{dataset:{}}).dataset.microUsd||""`, cell))
		now := fmt.Sprint(want)
		if priced && shown == now && last == now {
			break
		}
		last = now
		if time.Now().After(deadline) {
			t.Fatalf("the overview shows a cost of %q µ$ for desktop %s; its sessions %v cost %d µ$ in all; usage report %s", shown, id, ofDesktop, want, report)
		}
	}
	text := eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q).textContent`, cell))
	if wantText := fmt.Sprintf("$%.6f", float64(want)/1e6); want < 10000 && text != wantText {
		t.Errorf("the cost cell says %q, want %q", text, wantText)
	}
	t.Logf("desktop %s: %d µ$ over its sessions %v, shown as %s", id, want, ofDesktop, text)
	saveScreenshot(t, ctx, "console-costs")
}

// TestConsoleVisibility: a visible desktop page keeps the desktop awake well past its idle
// time; hidden (another tab of the window in front), the page goes on for its grace, then
// stops, and the desktop falls asleep an idle time later, not before the grace; visible
// again, the page sends its heartbeat at once, which does not wake the desktop.
func TestConsoleVisibility(t *testing.T) {
	t.Parallel()
	const (
		// idle is the time from running to the page's first heartbeat at most: a loaded
		// machine took over 8 s there (and the desktop fell asleep before the page opened).
		idle      = 12 * time.Second
		heartbeat = time.Second
		grace     = 16 * time.Second
	)
	p := startPlatform(t, func(c *gateway.Config) { withConsoleScreen(c); c.DesktopIdle = idle })
	// The browser first: its start is the slow part, and the idle clock starts at running.
	ctx := browser(t)
	signIn(t, ctx, p.url, p.key)
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "watched"}, 201, &d)
	d = p.wait(d.ID, desktop.Running)

	page := fmt.Sprintf("%s/console/desktop.html?id=%s&heartbeat_ms=%d&hidden_grace_ms=%d",
		p.url, url.QueryEscape(d.ID), heartbeat.Milliseconds(), grace.Milliseconds())
	step(t, ctx, "open the desktop's page", chromedp.Navigate(page), chromedp.WaitVisible(chromedp.ID("state")))
	if v := eval[string](t, ctx, `document.visibilityState`); v != "visible" {
		t.Fatalf("the page is %s, want visible", v)
	}
	awaitJS(t, ctx, "the page sends heartbeats", `document.body.dataset.heartbeat === "on" && Number(document.body.dataset.heartbeats) > 0`, 30*time.Second)

	// Visible: awake for two idle times.
	for until := time.Now().Add(2 * idle); time.Now().Before(until); time.Sleep(500 * time.Millisecond) {
		p.call("GET", "/v1/desktops/"+d.ID, nil, 200, &d)
		if d.State != desktop.Running {
			t.Fatalf("with its page visible the desktop went %s", d.State)
		}
	}

	// Hidden: a second tab in the same window comes to the front.
	first := chromedp.FromContext(ctx).Target.TargetID
	if _, err := chromedp.CallBrowser(ctx, target.CreateTarget, target.CreateTargetParams{URL: "about:blank", NewWindow: new(false), Background: new(false)}); err != nil {
		t.Fatalf("open a second tab: %v", err)
	}
	hidden := time.Now()
	if v := eval[string](t, ctx, `document.visibilityState`); v != "hidden" {
		t.Fatalf("behind another tab the page is %s, want hidden", v)
	}
	for deadline := hidden.Add(grace + idle + 2*time.Minute); ; time.Sleep(200 * time.Millisecond) {
		p.call("GET", "/v1/desktops/"+d.ID, nil, 200, &d)
		if d.State != desktop.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hidden for %v, the page still keeps the desktop awake (the grace is %v, idle %v)", time.Since(hidden), grace, idle)
		}
	}
	el := time.Since(hidden)
	if el < grace {
		t.Fatalf("the desktop went %s %v after its page was hidden: the page stopped before its %v grace", d.State, el, grace)
	}
	t.Logf("hidden, the page kept the desktop awake for %v (grace %v, idle %v)", el.Round(100*time.Millisecond), grace, idle)
	if on := eval[string](t, ctx, `document.body.dataset.heartbeat`); on != "off" {
		t.Errorf("after the grace the page's heartbeat is %q, want off", on)
	}
	d = p.wait(d.ID, desktop.Asleep)

	// Visible again: a heartbeat at once, and the desktop stays asleep.
	sent := eval[int](t, ctx, `Number(document.body.dataset.heartbeats)`)
	if _, err := chromedp.CallBrowser(ctx, target.ActivateTarget, target.ActivateTargetParams{TargetID: first}); err != nil {
		t.Fatalf("bring the page to the front: %v", err)
	}
	awaitJS(t, ctx, "the page is visible again", `document.visibilityState === "visible"`, 30*time.Second)
	awaitJS(t, ctx, "visible again, it sends a heartbeat",
		fmt.Sprintf(`Number(document.body.dataset.heartbeats) > %d && document.body.dataset.heartbeat === "on"`, sent), 5*time.Second)
	awaitJS(t, ctx, "the page shows it asleep", `document.getElementById("state").textContent === "asleep"`, 30*time.Second)
	p.call("GET", "/v1/desktops/"+d.ID, nil, 200, &d)
	if d.State != desktop.Asleep {
		t.Fatalf("a heartbeat from the page moved the asleep desktop to %s", d.State)
	}
}
