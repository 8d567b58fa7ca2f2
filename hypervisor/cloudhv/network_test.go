package cloudhv_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
)

// stubEgress is the node's egress proxy as a guest's driver sees it: an HTTP proxy on the
// Unix socket hypervisor.EgressSocket in the guest's agent dir. It forwards absolute-form
// GETs to the one loopback server it is given and refuses anything else.
func stubEgress(t *testing.T, agentDir, allowHost string) *atomic.Int32 {
	t.Helper()
	var served atomic.Int32
	ln, err := net.Listen("unix", filepath.Join(agentDir, hypervisor.EgressSocket))
	if err != nil {
		t.Fatal(err)
	}
	direct := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 30 * time.Second}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Host != allowHost {
			http.Error(w, "stub egress: only GET "+allowHost, http.StatusForbidden)
			return
		}
		resp, err := direct.Get(r.URL.String())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		served.Add(1)
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &served
}

// hostServices are what listens on the host's loopback in the root namespace: a web server
// the guest may reach only through the egress proxy, and a bare TCP listener (say Redis) it
// must never reach. Each counts what it was asked.
type hostServices struct {
	web          *httptest.Server
	directHits   atomic.Int32 // requests to /direct: only a guest bypassing the proxy sends one
	privateConns atomic.Int32
	private      net.Listener
}

const bigBody = 256 << 10

func startHostServices(t *testing.T) *hostServices {
	t.Helper()
	h := &hostServices{}
	h.web = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hello":
			fmt.Fprintln(w, "hello from the host")
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("x", bigBody)))
		case "/direct":
			h.directHits.Add(1)
		}
	}))
	t.Cleanup(h.web.Close)
	var err error
	if h.private, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.private.Close() })
	go func() {
		for {
			c, err := h.private.Accept()
			if err != nil {
				return
			}
			h.privateConns.Add(1)
			c.Close()
		}
	}()
	return h
}

// run is a guest shell command's exit code and output.
func run(t *testing.T, ctx context.Context, c *agent.Client, cmd string) (int, string) {
	t.Helper()
	res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return res.ExitCode, res.Stdout + res.Stderr
}

// TestGuestNetwork: a guest created through the driver (over the fake VMM, whose guest gets
// a tap joined to the VM's tap0) has 10.0.0.2/30 with the host end as its gateway, reaches
// the node's egress proxy on 10.0.0.1:3128 and through it a server on the host's loopback,
// and reaches nothing else (the host's loopback services, other ports of 10.0.0.1, the web
// server without the proxy). vm.counters' bytes grow with the traffic and show as Stats'
// net bytes. The relay is served again by a restarted driver; a guest restored from a memory
// snapshot gets its own network; Delete removes the namespaces, and a new driver removes a
// namespace of its own whose guest is gone.
func TestGuestNetwork(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 5*time.Minute)
	h := startHostServices(t)
	webAddr := h.web.Listener.Addr().String()
	s := e.spec(newID())
	s.Env = append(s.Env, "http_proxy=http://"+e.d.GuestProxy())
	if err := e.d.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	ns := e.d.NetNamespace(s.ID)
	if _, err := os.Stat(filepath.Join("/run/netns", ns)); err != nil {
		t.Fatalf("Create made no namespace %s: %v", ns, err)
	}
	served := stubEgress(t, s.AgentDir, webAddr)
	if err := e.d.Boot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	c := e.agentOf(s.ID)
	defer c.Close()
	waitHealthy(t, ctx, c, 2*time.Minute)

	if got := sh(t, ctx, c, "ip -4 -o addr show dev eth0; ip -4 route"); !strings.Contains(got, "inet 10.0.0.2/30") || !strings.Contains(got, "default via 10.0.0.1 dev eth0") {
		t.Errorf("the guest's network: %s", got)
	}
	fetch := "wget -q -O - http://" + webAddr
	if got := sh(t, ctx, c, fetch+"/hello"); got != "hello from the host\n" {
		t.Fatalf("through the egress proxy: %q", got)
	}
	if served.Load() != 1 {
		t.Errorf("the egress proxy served %d requests, want 1", served.Load())
	}
	st1, err := e.d.Stats(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st1.NetTxBytes <= 0 || st1.NetRxBytes <= 0 {
		t.Errorf("net counters after a request: rx %d tx %d, want both > 0", st1.NetRxBytes, st1.NetTxBytes)
	}

	// The attack: everything but the proxy is out of reach.
	privPort := h.private.Addr().(*net.TCPAddr).Port
	webPort := h.web.Listener.Addr().(*net.TCPAddr).Port
	for _, target := range []string{
		fmt.Sprintf("127.0.0.1 %d", privPort), fmt.Sprintf("10.0.0.1 %d", privPort),
		fmt.Sprintf("10.0.0.1 %d", webPort), "10.0.0.1 22",
	} {
		if code, out := run(t, ctx, c, "nc -w 5 "+target+" </dev/null"); code == 0 {
			t.Errorf("the guest reached %s: %s", target, out)
		}
	}
	for _, url := range []string{"http://" + webAddr + "/direct", fmt.Sprintf("http://10.0.0.1:%d/direct", webPort)} {
		if code, out := run(t, ctx, c, "wget -Y off -q -O - "+url); code == 0 {
			t.Errorf("the guest reached %s without the proxy: %s", url, out)
		}
	}
	if n, m := h.privateConns.Load(), h.directHits.Load(); n != 0 || m != 0 {
		t.Errorf("host services were reached: %d connections to the private listener, %d direct requests", n, m)
	}
	// The proxy forwards only what it allows; a refusal is its answer, not a way around it.
	if code, _ := run(t, ctx, c, fmt.Sprintf("wget -q -O - http://127.0.0.1:%d/", privPort)); code == 0 || h.privateConns.Load() != 0 {
		t.Errorf("the stub proxy let the guest reach the private listener")
	}

	// The counters follow the traffic.
	if got := sh(t, ctx, c, fetch+"/big | wc -c"); strings.TrimSpace(got) != fmt.Sprint(bigBody) {
		t.Fatalf("big download: %q bytes", got)
	}
	st2, err := e.d.Stats(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st2.NetRxBytes-st1.NetRxBytes < bigBody || st2.NetTxBytes <= st1.NetTxBytes {
		t.Errorf("net counters after a %d-byte download: rx %d → %d, tx %d → %d", bigBody, st1.NetRxBytes, st2.NetRxBytes, st1.NetTxBytes, st2.NetTxBytes)
	}

	// A node's process ends (Close): its relay goes with it; the guest and its namespace
	// stay. A new driver serves the relay again.
	e.d.Close()
	if code, _ := run(t, ctx, c, fetch+"/hello"); code == 0 {
		t.Fatal("the guest reached the proxy with no relay: the test proves nothing")
	}
	d2, err := cloudhv.New(ctx, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := sh(t, ctx, c, fetch+"/hello"); got != "hello from the host\n" {
		t.Fatalf("through the restarted driver's relay: %q", got)
	}

	// A guest restored from a memory snapshot has a namespace, tap and relay of its own.
	snap := filepath.Join(e.base, "snap")
	if _, err := d2.Snapshot(ctx, s.ID, snap, true); err != nil {
		t.Fatal(err)
	}
	s2 := e.spec(newID())
	s2.Env = s.Env
	if err := d2.Restore(ctx, s2, snap); err != nil {
		t.Fatal(err)
	}
	stubEgress(t, s2.AgentDir, webAddr)
	c2 := e.agentOfDriver(d2, s2.ID)
	defer c2.Close()
	waitHealthy(t, ctx, c2, 2*time.Minute)
	if got := sh(t, ctx, c2, fetch+"/hello"); got != "hello from the host\n" {
		t.Fatalf("from the restored guest: %q", got)
	}

	for _, id := range []string{s.ID, s2.ID} {
		if err := d2.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join("/run/netns", d2.NetNamespace(id))); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("namespace of %s after Delete: %v", id, err)
		}
	}

	// A namespace of this driver's whose guest has no record (a create that never finished)
	// is removed by the next driver.
	orphan := e.d.NetNamespace(newID())
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", orphan).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", orphan).Run() })
	if _, err := cloudhv.New(ctx, e.opts); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", orphan)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("orphan namespace %s after a new driver: %v", orphan, err)
	}
	if l := e.leftovers(); len(l) > 0 {
		t.Errorf("left on the host: %v", l)
	}
}

// holdingEgress is a node's egress proxy that holds every connection open (an idle
// keep-alive, a tunnel) until the relay ends it: the answer counts the connections ended.
func holdingEgress(t *testing.T, agentDir string) (accepted, ended *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(agentDir, hypervisor.EgressSocket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	accepted, ended = new(atomic.Int32), new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
				ended.Add(1)
			}()
		}
	}()
	return accepted, ended
}

// guestHoldingRelay boots a guest one of whose processes holds a connection to the node's
// egress proxy (holdingEgress) through the driver's relay, and answers what the proxy counts.
func (e *env) guestHoldingRelay(t *testing.T, ctx context.Context) (s hypervisor.Spec, ended *atomic.Int32) {
	t.Helper()
	s = e.spec(newID())
	if err := e.d.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	accepted, ended := holdingEgress(t, s.AgentDir)
	if err := e.d.Boot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	c := e.agentOf(s.ID)
	t.Cleanup(c.Close)
	waitHealthy(t, ctx, c, 2*time.Minute)
	sh(t, ctx, c, "(sleep 600 | nc 10.0.0.1 3128 >/dev/null 2>&1 &)")
	if !eventually(30*time.Second, func() bool { return accepted.Load() > 0 }) {
		t.Fatal("the guest's connection never reached the egress proxy")
	}
	return s, ended
}

// TestStopEndsGuestRelayConnections: Stop of a guest whose VMM died (SIGKILL: its guest's end
// of a connection vanished without a FIN, as with a real CH's vmm.shutdown) while one of its
// processes held a connection through the egress relay returns at once, the connection
// closed at the proxy's end too; it does not wait for the connection to end on its own.
func TestStopEndsGuestRelayConnections(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 8*time.Minute)
	s, ended := e.guestHoldingRelay(t, ctx)
	info, err := e.d.Info(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A real VMM leaves no mounts, but the fake one's guest is mounts it can no longer undo.
	t.Cleanup(func() { unmountUnder(t, e.vmmTmp) })
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	done := make(chan error, 1)
	go func() { done <- e.d.Stop(sctx, s.ID) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Stop: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Stop has not returned after 30 s: it waits for the guest's connection through the relay")
	}
	t.Logf("Stop took %v", time.Since(t0))
	if !eventually(5*time.Second, func() bool { return ended.Load() > 0 }) {
		t.Error("after Stop the egress proxy's end of the guest's connection is still open")
	}
}

// TestMemorySnapshotEndsGuestRelayConnections: a memory snapshot of a guest holding a
// connection through the egress relay closes it (no connection outlives the snapshot: the
// restored guest has another VMM and relay) and completes, rather than wait in the Stop that
// ends it for the connection to end on its own.
func TestMemorySnapshotEndsGuestRelayConnections(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 8*time.Minute)
	s, ended := e.guestHoldingRelay(t, ctx)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := e.d.Snapshot(sctx, s.ID, filepath.Join(e.base, "snap"), true)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Snapshot: %v", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatalf("a memory Snapshot has not returned after 45 s: it waits for the guest's connection through the relay")
	}
	t.Logf("Snapshot took %v", time.Since(t0))
	if !eventually(5*time.Second, func() bool { return ended.Load() > 0 }) {
		t.Error("after the memory snapshot the egress proxy's end of the guest's connection is still open")
	}
}

// eventually reports whether cond holds within d.
func eventually(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// unmountUnder detaches every mount under dir, deepest first (the loop devices of mount -o
// loop go with their mounts).
func unmountUnder(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Error(err)
		return
	}
	var points []string
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", p, err)
		}
	}
}
