package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
	"wb/hypervisor/cloudhv/chapi"
	"wb/hypervisor/cloudhv/image"
	"wb/hypervisor/templates"
	"wb/internal/netguard"
	"wb/internal/wbbin"
	"wb/node"
	"wb/quota"
	"wb/session"
	"wb/store"
)

// fakeCH is the fake Cloud Hypervisor's command (chvtest/fakech), built once per test binary,
// and the rootfs image cache every cloudhv test driver shares: made there once, tpl_base's
// image saves each test its own mkfs (at once, a dozen of them starve the machine).
var fakeCH struct {
	once  sync.Once
	dir   string // removed by TestMain
	path  string
	cache string
	err   error
}

// fakeCHPath builds the fake VMM once per test binary and answers its path.
func fakeCHPath(t testing.TB) string {
	t.Helper()
	fakeCH.once.Do(func() {
		dir, err := os.MkdirTemp("", "wbn-fakech-")
		if err != nil {
			fakeCH.err = err
			return
		}
		fakeCH.dir = dir
		_ = os.Chmod(dir, 0o755)
		if fakeCH.path, err = wbbin.FakeCH(dir); err != nil {
			fakeCH.err = err
			return
		}
		fakeCH.cache = filepath.Join(dir, "cache")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if _, err := image.RootFSImage(ctx, fakeCH.cache, catalog[templates.Base].RootFS, wbBin); err != nil {
			fakeCH.err, fakeCH.path = err, "the rootfs image of "+templates.Base
		}
	})
	if fakeCH.err != nil {
		t.Fatalf("build fakech: %v\n%s", fakeCH.err, fakeCH.path)
	}
	return fakeCH.path
}

// openCloudHVDriver is a cloudhv driver over the fake VMM on base's state dir.
func openCloudHVDriver(t testing.TB, base, cgroupParent string) *cloudhv.Driver {
	t.Helper()
	bin := fakeCHPath(t)
	kernel := filepath.Join(base, "vmlinuz")
	if err := os.WriteFile(kernel, []byte("the fake VMM loads no kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := cloudhv.New(context.Background(), cloudhv.Options{Binary: bin, Kernel: kernel,
		StateDir: filepath.Join(base, "ch"), CacheDir: fakeCH.cache,
		CgroupParent: cgroupParent, Logger: testLogger(t)}) // the fake checks every request and answer against the API document
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestCloudHVNodeRestart: a node that stops leaves its VM running; a new node (and driver)
// on the same dirs recovers it, reaches its agent, serves its egress relay again (the first
// driver's ended with it, as with the node's process), and fails the session with
// guest_crash when its VMM dies.
func TestCloudHVNodeRestart(t *testing.T) {
	t.Parallel()
	const project = "proj_chv_restart"
	st, _ := newStore(t)
	base, dataDir := tempDir(t), tempDir(t)
	d := newDriver(t, "cloudhv", base)
	cfg := nodeConfig(t, st, d, dataDir, "node_chv_restart")
	fetch := fmt.Sprintf("wget -q -O - http://web.test:%d/hello", egressWeb(t, &cfg))
	a := startNode(t, cfg)
	s := provision(t, st, a.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
	ctx := ctxT(t, 5*time.Minute)
	if res, err := execIn(ctx, a.Node, s, "echo kept > /workspace/f && "+fetch); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	a.stop(t)
	d.(*cloudhv.Driver).Close()
	ids, err := d.List(ctx)
	if err != nil || len(ids) != 1 {
		t.Fatalf("guests: %v, %v", ids, err)
	}
	direct := agent.NewDialClient(func(ctx context.Context) (net.Conn, error) { return d.(*cloudhv.Driver).DialAgent(ctx, ids[0]) })
	defer direct.Close()
	if res, err := direct.Exec(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "http_proxy=http://10.0.0.1:3128 " + fetch}}, nil); err != nil || res.ExitCode == 0 {
		t.Fatalf("with no node (and no relay) the guest's fetch: %+v, %v; want a refusal", res, err)
	}
	info, err := d.Info(ctx, s.ID)
	if err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("after the node stopped its guest is %+v (%v), want running", info, err)
	}
	d2 := openDriver(t, "cloudhv", base, strings.TrimSuffix(d.CgroupPath(""), "/"))
	if info, err := d2.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("the new driver sees the guest %+v (%v), want running", info, err)
	}
	cfg2 := nodeConfig(t, st, d2, dataDir, "node_chv_restart")
	cfg2.Egress, cfg2.Runtime = cfg.Egress, cfg.Runtime
	restarted := time.Now()
	b := startNode(t, cfg2)
	// startNode returns on the first node's registration; the new node heartbeats only once
	// it has recovered its guests.
	for {
		nodes, err := st.Nodes(ctx)
		if err == nil && slices.ContainsFunc(nodes, func(i store.NodeInfo) bool { return i.ID == cfg2.Info.ID && i.HeartbeatAt.After(restarted) }) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the restarted node never heartbeated")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res, err := execIn(ctx, b.Node, s, "cat /workspace/f"); err != nil || res.Stdout != "kept\n" {
		t.Fatalf("exec through the restarted node: %+v, %v", res, err)
	}
	if res, err := execIn(ctx, b.Node, s, fetch); err != nil || res.Stdout != "hello from the host\n" {
		t.Fatalf("egress through the restarted node: %+v, %v", res, err)
	}
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	end, _ := waitState(t, st, project, s.ID, time.Minute, session.Stopped, session.Failed, session.Expired)
	checkEnded(t, end, session.Failed, session.GuestCrash)
}

// allowEgress is a runtime decision point that allows every egress and everything else.
type allowEgress struct{}

func (allowEgress) Check(context.Context, node.RuntimeSession, session.GuestEvent) (node.Verdict, error) {
	return node.Verdict{AllowEgress: true}, nil
}

// hostResolver answers web.test with the test's web server's loopback address; it sends
// nothing.
type hostResolver struct{ addr netip.Addr }

func (r hostResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host == "web.test" {
		return []netip.Addr{r.addr}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// egressWeb is a web server on 127.0.0.2 (loopback, but not the address Redis listens on)
// and a node config whose guests may reach it, and only it, through the egress proxy as
// http://web.test:PORT. It answers /hello and /big (256 KiB).
func egressWeb(t *testing.T, cfg *node.Config) (port int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hello":
			_, _ = io.WriteString(w, "hello from the host\n")
		case "/big":
			_, _ = w.Write(make([]byte, 256<<10))
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	guard, err := netguard.New(netguard.Options{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
		Resolver: hostResolver{netip.MustParseAddr("127.0.0.2")}})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Egress, cfg.Runtime = guard, allowEgress{}
	return ln.Addr().(*net.TCPAddr).Port
}

// TestCloudHVEgress: a cloudhv guest (a VM over the fake VMM, its tap joined to the runc
// guest's eth0) is given the proxy http://10.0.0.1:3128 by the node, reaches a server on
// the host's loopback through the node's egress proxy, and nothing else: not Redis nor a
// listener on the host's loopback, not 10.0.0.1 on other ports. The VM's net counters grow
// with the traffic, and the session's usage counts the egress bytes. Deleting the session
// removes the guest's namespace.
func TestCloudHVEgress(t *testing.T) {
	t.Parallel()
	const project = "proj_chv_egress"
	st, rp := newStore(t)
	base, dataDir := tempDir(t), tempDir(t)
	d := newDriver(t, "cloudhv", base)
	cfg := nodeConfig(t, st, d, dataDir, "node_chv_egress")
	port := egressWeb(t, &cfg)
	a := startNode(t, cfg)
	s := provision(t, st, a.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
	ctx := ctxT(t, 5*time.Minute)
	sh := func(cmd string) session.ExecResult {
		t.Helper()
		res, err := execIn(ctx, a.Node, s, cmd)
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		return res
	}
	ids, err := d.List(ctx)
	if err != nil || len(ids) != 1 {
		t.Fatalf("guests: %v, %v", ids, err)
	}
	guest := ids[0]

	if res := sh("echo $http_proxy $HTTPS_PROXY"); res.Stdout != "http://10.0.0.1:3128 http://10.0.0.1:3128\n" {
		t.Errorf("the guest's proxy: %+v", res)
	}
	web := fmt.Sprintf("http://web.test:%d", port)
	if res := sh("wget -q -O - " + web + "/hello"); res.ExitCode != 0 || res.Stdout != "hello from the host\n" {
		t.Fatalf("through the node's egress proxy: %+v", res)
	}
	redisPort := rp.Addr()[strings.LastIndexByte(rp.Addr(), ':')+1:]
	private, accepted := loopbackListener(t)
	for _, target := range []string{"127.0.0.1 " + redisPort, "10.0.0.1 " + redisPort, "127.0.0.1 " + private,
		"10.0.0.1 " + private, fmt.Sprintf("10.0.0.1 %d", port), "10.0.0.1 22"} {
		if res := sh("nc -w 5 " + target + " </dev/null"); res.ExitCode == 0 {
			t.Errorf("the guest reached %s: %+v", target, res)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's loopback listener accepted %d connections from the guest", n)
	}

	before, err := d.Stats(ctx, guest)
	if err != nil {
		t.Fatal(err)
	}
	if res := sh("wget -q -O - " + web + "/big | wc -c"); strings.TrimSpace(res.Stdout) != "262144" {
		t.Fatalf("big download: %+v", res)
	}
	after, err := d.Stats(ctx, guest)
	if err != nil {
		t.Fatal(err)
	}
	if after.NetRxBytes-before.NetRxBytes < 256<<10 || after.NetTxBytes <= before.NetTxBytes {
		t.Errorf("VM net counters over a 256 KiB download: rx %d → %d, tx %d → %d", before.NetRxBytes, after.NetRxBytes, before.NetTxBytes, after.NetTxBytes)
	}
	// The node's usage records: the bytes the guest sent out through the proxy (its
	// requests), which the VM's tx counter (frames, headers and all) covers.
	rdb := redisClient(t, rp.Addr())
	for {
		var egress int64
		msgs, err := rdb.XRange(ctx, store.ProjectKeys(project).UsageStream(), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if r, err := quota.DecodeRecord(m.Values); err == nil && r.SessionID == s.ID {
				egress += r.EgressBytes
			}
		}
		if egress > 0 {
			if egress > after.NetTxBytes {
				t.Errorf("usage egress %d bytes > the VM's tx %d bytes", egress, after.NetTxBytes)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the session's usage records never counted egress bytes")
		}
		time.Sleep(100 * time.Millisecond)
	}

	ns := filepath.Join("/run/netns", d.(*cloudhv.Driver).NetNamespace(guest))
	if _, err := os.Stat(ns); err != nil {
		t.Fatalf("the guest's namespace: %v", err)
	}
	deleteSession(t, st, a.Node, project, s.ID)
	if err := waitGuestGone(t, d, guest, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ns); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the guest's namespace after the session was deleted: %v", err)
	}
}

// loopbackListener listens on the host's loopback and counts the connections it accepts.
func loopbackListener(t *testing.T) (port string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port), accepted
}

// TestCloudHVResize: the node resizes a running cloudhv session in place through the
// driver's hypervisor.Resizer (vm.resize: the fake's guest gets the new CPU quota and memory
// limit); the session's resources and the node's used capacity follow. What the VM cannot
// do (shrink its memory) is refused and changes nothing, as is a size below one.
func TestCloudHVResize(t *testing.T) {
	t.Parallel()
	const project = "proj_chv_resize"
	st, _ := newStore(t)
	base, dataDir := tempDir(t), tempDir(t)
	d := newDriver(t, "cloudhv", base)
	cfg := nodeConfig(t, st, d, dataDir, "node_chv_resize")
	a := startNode(t, cfg)
	s := provision(t, st, a.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
	ctx := ctxT(t, 3*time.Minute)
	// used answers the node's used capacity from its first heartbeat after since.
	used := func(since time.Time) (int, int) {
		for {
			nodes, err := st.Nodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, i := range nodes {
				if i.ID == cfg.Info.ID && i.HeartbeatAt.After(since) {
					return i.UsedVCPU, i.UsedMemoryMiB
				}
			}
			if ctx.Err() != nil {
				t.Fatal("the node never heartbeated")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ids, err := d.List(ctx)
	if err != nil || len(ids) != 1 {
		t.Fatalf("guests: %v, %v", ids, err)
	}
	vmm := chapi.New(filepath.Join(d.(*cloudhv.Driver).GuestDir(ids[0]), "api.sock"))
	vmSize := func() (int, int) {
		vi, err := vmm.VMInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return vi.Config.Cpus.BootVcpus, int(vi.Config.Memory.Size >> 20)
	}
	bigger := session.Resources{VCPU: 2, MemoryMiB: small().MemoryMiB + 128, DiskGiB: 1, SizeClass: "m"}
	if err := a.Node.Resize(ctx, s, bigger); err != nil {
		t.Fatal(err)
	}
	resized := time.Now()
	if v, m := vmSize(); v != bigger.VCPU || m != bigger.MemoryMiB {
		t.Errorf("the VM after the resize: %d vCPU, %d MiB; want %d, %d", v, m, bigger.VCPU, bigger.MemoryMiB)
	}
	if v, m := used(resized); v != bigger.VCPU || m != bigger.MemoryMiB {
		t.Errorf("the node's used capacity %d vCPU, %d MiB; want %d, %d", v, m, bigger.VCPU, bigger.MemoryMiB)
	}
	for _, bad := range []session.Resources{{VCPU: 2, MemoryMiB: small().MemoryMiB}, {VCPU: 0, MemoryMiB: 512}} {
		if err := a.Node.Resize(ctx, s, bad); err == nil {
			t.Errorf("resize to %+v: no error", bad)
		}
	}
	refused := time.Now()
	if v, m := vmSize(); v != bigger.VCPU || m != bigger.MemoryMiB {
		t.Errorf("the VM after refused resizes: %d vCPU, %d MiB; want %d, %d", v, m, bigger.VCPU, bigger.MemoryMiB)
	}
	if v, m := used(refused); v != bigger.VCPU || m != bigger.MemoryMiB {
		t.Errorf("after refused resizes the node uses %d vCPU, %d MiB; want %d, %d", v, m, bigger.VCPU, bigger.MemoryMiB)
	}
	if res, err := execIn(ctx, a.Node, s, "echo alive"); err != nil || res.Stdout != "alive\n" {
		t.Errorf("the resized guest: %+v, %v", res, err)
	}
}
