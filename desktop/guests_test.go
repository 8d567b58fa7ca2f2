package desktop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/desktop"
	"wb/gateway"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/redistest"
	"wb/internal/testwait"
	"wb/internal/wbbin"
	"wb/node"
	"wb/placer"
	"wb/quota"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// platform is the whole engine in this process, as `wb serve` wires it: a redis-server, the
// store, one node with real runsc guests, the placer and the gateway.
type platform struct {
	t   testing.TB
	url string
	key string
}

type logWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// TestMain lets the nine tests with real guests run all at once: each starts its own platform
// and mostly waits (on idle times, sleeps and wakes, a browser; half the machine's CPU stayed
// idle). One after the other the package took 149 s, two at a time (GOMAXPROCS) 106, four
// 85, all at once 76-84: then TestConsoleVisibility's own 57 s of idle times is most of it.
func TestMain(m *testing.M) {
	testwait.Parallel(10)
	code := m.Run()
	// Every test's guests are gone: the shared files go too (every make test left 7 MB).
	if dir := sharedFilesDir.Load(); dir != nil {
		_ = os.RemoveAll(*dir)
	}
	os.Exit(code)
}

// files are the static agent (wb-agent) and the templates, made once for the package's tests,
// in sharedFilesDir (removed once they all ran: the tests' guests may map them until then).
type files struct {
	bin  string
	tpls templates.Catalog
}

var sharedFilesDir atomic.Pointer[string]

var sharedFiles = sync.OnceValues(func() (files, error) {
	dir, err := os.MkdirTemp("", "wbdfiles")
	if err != nil {
		return files{}, err
	}
	sharedFilesDir.Store(&dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return files{}, err
	}
	bin, err := wbbin.Agent(dir)
	if err != nil {
		return files{}, err
	}
	tpls, err := templates.Assemble(filepath.Join(dir, "templates"))
	return files{bin, tpls}, err
})

func startPlatform(t testing.TB, cfg func(*gateway.Config)) *platform {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("real guests need root")
	}
	if _, err := os.Stat("/usr/bin/runsc"); err != nil {
		t.Skip("runsc is not installed")
	}
	lw := &logWriter{t: t}
	t.Cleanup(func() { lw.mu.Lock(); lw.done = true; lw.mu.Unlock() })
	log := slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelInfo}))
	base, err := os.MkdirTemp("", "wbd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	shared, err := sharedFiles()
	if err != nil {
		t.Fatal(err)
	}
	bin, tpls := shared.bin, shared.tpls
	drv, err := oci.New(oci.Options{Runtime: "runsc", StateRoot: filepath.Join(base, "state"), BundleRoot: filepath.Join(base, "bundles"),
		CgroupParent: "/wbdesktest-" + fmt.Sprint(time.Now().UnixNano()), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Server(t)
	tiers := session.DefaultTiers()
	for i := range tiers {
		tiers[i].ColdP95 = max(tiers[i].ColdP95, 20*time.Second) // a busy 2-core machine boots slowly
	}
	st := store.New(rdb, store.WithTiers(tiers))
	n, err := node.New(node.Config{Tiers: tiers, Store: st, Driver: drv, Templates: tpls, DataDir: filepath.Join(base, "data"), AgentBin: bin,
		Info:      store.NodeInfo{ID: "node_desk", Addr: "http://127.0.0.1:1", Region: "local", Zone: "local-a", Tiers: []int{1, 2, 3, 4}, VCPU: 4, MemoryMiB: 1 << 16},
		Heartbeat: time.Second, Flush: time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = n.Run(ctx) })
	pl := placer.New(placer.Config{Store: st, Provisioner: n, Tiers: tiers, Logger: log})
	wg.Go(func() { _ = pl.Run(ctx) })
	// The settler, as `wb serve` runs it: GET /v1/usage answers settled usage.
	settler := quota.NewSettler(rdb, quota.SettlerOptions{Consumer: "settler_desk", Logger: log})
	wg.Go(func() { _ = settler.Run(ctx) })
	gcfg := gateway.Config{Store: st, Limiter: quota.NewRateLimiter(rdb), Accounts: quota.NewAccounts(rdb),
		Webhooks: webhooks.NewRegistry(rdb, webhooks.RegistryOptions{AllowPrivate: true}), Guests: n.Local(),
		Catalog: node.CatalogOf(tpls), Regions: []string{"local"}, Tiers: tiers, Logger: log, DesktopTemplate: templates.Base}
	if cfg != nil {
		cfg(&gcfg)
	}
	gw, err := gateway.New(gcfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	gw.PublicURL = srv.URL
	t.Cleanup(func() {
		srv.Close()
		gw.Close()
		cancel()
		wg.Wait()
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		n.DestroyAll(dctx)
		_ = drv.RemoveCgroupParent()
	})
	p, key, err := st.CreateProject(ctx, "desktops")
	if err != nil {
		t.Fatal(err)
	}
	_ = p
	// Wait for the node's registration: a desktop starts only where a node has room.
	for deadline := time.Now().Add(90 * time.Second); ; {
		nodes, _ := st.Nodes(ctx)
		if len(nodes) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the node never registered")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &platform{t: t, url: srv.URL, key: key}
}

func (p *platform) call(method, path string, body any, wantStatus int, out any) {
	p.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, p.url+path, rd)
	req.Header.Set("Authorization", "Bearer "+p.key)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		p.t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, wantStatus, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			p.t.Fatal(err)
		}
	}
}

// wait polls the desktop until it is in want; each wait has its own generous deadline.
func (p *platform) wait(id string, want desktop.State) desktop.Desktop {
	p.t.Helper()
	var d desktop.Desktop
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		d = desktop.Desktop{} // fresh each time: the API leaves out the fields that are unset
		p.call("GET", "/v1/desktops/"+id, nil, 200, &d)
		if d.State == want {
			return d
		}
		if d.State == desktop.Failed && want != desktop.Failed {
			p.t.Fatalf("desktop failed: %s", d.Message)
		}
	}
	p.t.Fatalf("desktop %s is %s (%s), want %s", id, d.State, d.Message, want)
	return d
}

// use sends the desktop a file: a use (seed 001), which keeps it awake for its idle time
// from now. (An exec in its session is not one.)
func (p *platform) use(d desktop.Desktop) {
	p.t.Helper()
	if status, body := p.raw("PUT", "/v1/desktops/"+d.ID+"/files?path="+memoryDir+"/used", []byte("used")); status != 204 {
		p.t.Fatalf("a file sent to the desktop: %d %s", status, body)
	}
}

// sh runs a command in the desktop's session and answers its stdout.
func (p *platform) sh(d desktop.Desktop, cmd string) string {
	p.t.Helper()
	var res session.ExecResult
	p.call("POST", "/v1/sessions/"+d.SessionID+"/exec", map[string]any{"command": cmd}, 200, &res)
	if res.ExitCode != 0 {
		p.t.Fatalf("%q exited %d: %s", cmd, res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout)
}

// running reports whether the background sleep whose pid /workspace/bg.pid holds runs.
func (p *platform) running(d desktop.Desktop) bool {
	p.t.Helper()
	out := p.sh(d, `pid=$(cat /workspace/bg.pid); tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null || true`)
	return strings.Contains(out, "sleep 3600")
}

// memoryDir stands in for the desktop's /data/memory/ on tpl_base, whose disk is /workspace.
const memoryDir = "/workspace/memory"

// TestDesktopWhatIsKept is the seed's "What is kept" and "Sleep and stop compared" with a real
// runsc guest: across a sleep the disk (a file) and the running processes (a background
// sleep) come back; across a stop only the disk; the name and MCP URL across both.
func TestDesktopWhatIsKept(t *testing.T) {
	t.Parallel()
	p := startPlatform(t, nil)
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "kept"}, 201, &d)
	first := d
	d = p.wait(d.ID, desktop.Running)
	p.sh(d, "mkdir -p "+memoryDir+" && echo remembered > "+memoryDir+"/note")
	p.sh(d, "sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > /workspace/bg.pid")
	if !p.running(d) {
		t.Fatal("the background process is not running")
	}

	p.call("POST", "/v1/desktops/"+d.ID+":sleep", nil, 202, &d)
	d = p.wait(d.ID, desktop.Asleep)
	if !d.StateSaved {
		t.Fatalf("asleep without its state: %s", d.Message)
	}
	p.call("POST", "/v1/desktops/"+d.ID+":wake", nil, 202, &d)
	d = p.wait(d.ID, desktop.Running)
	if got := p.sh(d, "cat "+memoryDir+"/note"); got != "remembered" {
		t.Errorf("after sleep the file holds %q", got)
	}
	if !p.running(d) {
		t.Error("after sleep the background process is gone")
	}

	p.call("POST", "/v1/desktops/"+d.ID+":stop", nil, 202, &d)
	d = p.wait(d.ID, desktop.Stopped)
	p.call("POST", "/v1/desktops/"+d.ID+":start", nil, 202, &d)
	d = p.wait(d.ID, desktop.Running)
	if got := p.sh(d, "cat "+memoryDir+"/note"); got != "remembered" {
		t.Errorf("after stop the file holds %q", got)
	}
	if p.running(d) {
		t.Error("after stop the background process survived")
	}
	if d.Name != first.Name || d.MCPURL != first.MCPURL || d.ID != first.ID {
		t.Errorf("name or MCP URL changed: %+v, was %+v", d, first)
	}
	p.call("DELETE", "/v1/desktops/"+d.ID, nil, 200, nil)
	p.call("GET", "/v1/desktops/"+d.ID, nil, 404, nil)
}

// TestDesktopIdleAndResize with a real runsc guest: a desktop left unused for the idle time
// sleeps with its state; a resize while awake waits for the next start, so the next sleep
// saves no state and the wake is fresh from the disk at the new size.
func TestDesktopIdleAndResize(t *testing.T) {
	t.Parallel()
	// Long enough that the steps after the first wake finish before it falls idle again: at
	// 8 s a cold make test's wake, PATCH and use took longer, the idle loop slept it first
	// (resized, without its state), the use woke it at the new size, and the test's own
	// sleep then saved the new session's state.
	const idle = 20 * time.Second
	p := startPlatform(t, func(c *gateway.Config) { c.DesktopIdle = idle })
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "idle"}, 201, &d)
	d = p.wait(d.ID, desktop.Running)
	p.sh(d, "mkdir -p "+memoryDir+" && echo kept > "+memoryDir+"/note")
	running := time.Now()
	d = p.wait(d.ID, desktop.Asleep) // nobody uses it; GETs are no use
	if el := time.Since(running); el < idle/2 {
		t.Errorf("fell asleep %v after it ran; idle is %v", el, idle)
	}
	if !d.StateSaved {
		t.Fatalf("an idle sleep saved no state: %s", d.Message)
	}
	p.call("POST", "/v1/desktops/"+d.ID+":wake", nil, 202, &d)
	d = p.wait(d.ID, desktop.Running)
	p.use(d)

	p.call("PATCH", "/v1/desktops/"+d.ID, map[string]any{"size": "m"}, 200, &d)
	if d.Size != "s" || d.NextSize != "m" || d.State != desktop.Running {
		t.Fatalf("resized while running: %+v", d)
	}
	// A use right before each sleep: on a loaded machine the steps since the last use took
	// longer than the idle time, the idle loop was putting it to sleep, and the sleep answered
	// 409 (stopping).
	p.use(d)
	p.call("POST", "/v1/desktops/"+d.ID+":sleep", nil, 202, &d)
	d = p.wait(d.ID, desktop.Asleep)
	if d.StateSaved || d.Size != "m" || !strings.Contains(d.Message, "resized") {
		t.Fatalf("asleep after a resize: %+v", d)
	}
	p.call("POST", "/v1/desktops/"+d.ID+":wake", nil, 202, &d)
	d = p.wait(d.ID, desktop.Running)
	var s session.Session
	p.call("GET", "/v1/sessions/"+d.SessionID, nil, 200, &s)
	if s.Resources.SizeClass != "m" {
		t.Errorf("woke at size %s", s.Resources.SizeClass)
	}
	if got := p.sh(d, "cat "+memoryDir+"/note"); got != "kept" {
		t.Errorf("after a resize the file holds %q", got)
	}
	// The node offers 4 vCPUs: size xl (8) has no room, so Wake answers 409 and it stays asleep.
	p.call("PATCH", "/v1/desktops/"+d.ID, map[string]any{"size": "xl"}, 200, &d)
	p.use(d)
	p.call("POST", "/v1/desktops/"+d.ID+":sleep", nil, 202, &d)
	d = p.wait(d.ID, desktop.Asleep)
	p.call("POST", "/v1/desktops/"+d.ID+":wake", nil, 409, nil)
	if d = p.wait(d.ID, desktop.Asleep); d.Size != "xl" {
		t.Errorf("after a refused wake: %+v", d)
	}
}
