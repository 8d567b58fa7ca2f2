package cloudhv_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
	"wb/hypervisor/templates"
	"wb/internal/wbbin"
)

// shared is what every test uses, built once per test binary: the fake VMM's command, a
// static wb, tpl_base and a stand-in kernel file.
var shared struct {
	dir, fakech, wb, kernel string
	tpl                     templates.Template
	err                     error
}

func TestMain(m *testing.M) {
	shared.err = setup()
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

func setup() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (the fake VMM loop-mounts disks and runs runc)")
	}
	for _, tool := range []string{"runc", "mkfs.ext4", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("needs %s: %w", tool, err)
		}
	}
	dir, err := os.MkdirTemp("", "chd-")
	if err != nil {
		return err
	}
	shared.dir = dir
	if err := os.Chmod(dir, 0o755); err != nil { // the runc guest's root is an unprivileged uid
		return err
	}
	if shared.fakech, err = wbbin.FakeCH(dir); err != nil {
		return err
	}
	if shared.wb, err = wbbin.Agent(dir); err != nil {
		return err
	}
	cat, err := templates.AssembleWith(filepath.Join(dir, "tpl"), templates.Options{HostRoot: filepath.Join(dir, "nohost")})
	if err != nil {
		return err
	}
	shared.tpl = cat[templates.Base]
	shared.kernel = filepath.Join(dir, "vmlinuz")
	return os.WriteFile(shared.kernel, []byte("the fake VMM loads no kernel"), 0o644)
}

func need(t testing.TB) {
	t.Helper()
	if shared.err != nil {
		t.Skip(shared.err)
	}
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// env is one test's driver and its dirs.
type env struct {
	d      *cloudhv.Driver
	base   string // the test's own dir
	vmmTmp string // the fake VMMs' TMPDIR: their guests' mounts live there
	opts   cloudhv.Options
}

// newEnv makes a driver over the fake with its own state dir, cache and cgroup parent.
func newEnv(t testing.TB) *env {
	t.Helper()
	need(t)
	base, err := os.MkdirTemp(shared.dir, "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	e := &env{base: base, vmmTmp: filepath.Join(base, "vmmtmp")}
	if err := os.Mkdir(e.vmmTmp, 0o755); err != nil {
		t.Fatal(err)
	}
	e.opts = cloudhv.Options{
		Binary:       shared.fakech,
		Kernel:       shared.kernel,
		StateDir:     filepath.Join(base, "s"),
		CacheDir:     filepath.Join(shared.dir, "cache"),
		CgroupParent: "/wbtest-chd-" + strings.ToLower(rand.Text()[:8]),
		Env:          []string{"TMPDIR=" + e.vmmTmp},
		Logger:       slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	e.d, err = cloudhv.New(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ids, _ := e.d.List(ctx)
		for _, id := range ids {
			if t.Failed() {
				b, _ := os.ReadFile(filepath.Join(e.d.GuestDir(id), "vmm.log"))
				t.Logf("guest %s VMM log:\n%s", id, b)
			}
			if err := e.d.Delete(ctx, id); err != nil {
				t.Logf("cleanup: delete %s: %v", id, err)
			}
		}
		_ = e.d.RemoveCgroupParent()
	})
	return e
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// spec is a guest as the node describes one.
func (e *env) spec(id string) hypervisor.Spec {
	node := filepath.Join(e.base, "node", id)
	return hypervisor.Spec{
		ID: id, RootFS: shared.tpl.RootFS, Writable: filepath.Join(node, "writable"), AgentDir: filepath.Join(node, "agent"),
		AgentBin: shared.wb, AgentSocket: "agent.sock",
		Args: []string{hypervisor.GuestAgentBin, "agent", "--socket", hypervisor.GuestAgentDir + "/agent.sock", "--root", hypervisor.GuestWorkspace,
			"--egress-listen", "127.0.0.1:3128", "--egress-socket", hypervisor.GuestAgentDir + "/egress.sock"},
		Env:  append([]string{}, shared.tpl.Env...),
		VCPU: 1, MemoryMiB: 256, DiskGiB: 1, Pids: 256,
	}
}

// agentOf is a client of guest id's agent through the driver.
func (e *env) agentOf(id string) *agent.Client {
	return agent.NewDialClient(func(ctx context.Context) (net.Conn, error) { return e.d.DialAgent(ctx, id) })
}

// boot creates and boots guest id and waits for its agent.
func (e *env) boot(t testing.TB, ctx context.Context, s hypervisor.Spec) *agent.Client {
	t.Helper()
	if err := e.d.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Boot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	c := e.agentOf(s.ID)
	t.Cleanup(c.Close)
	waitHealthy(t, ctx, c, 2*time.Minute)
	return c
}

func waitHealthy(t testing.TB, ctx context.Context, c *agent.Client, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.Health(hctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("the guest's agent never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sh runs a shell command in the guest and answers its stdout (failing on a non-zero exit).
func sh(t testing.TB, ctx context.Context, c *agent.Client, cmd string) string {
	t.Helper()
	res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d, stderr %q", cmd, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

// leftovers lists what of the test's guests is still on the host: processes started from
// the fake's binary, mounts and loop devices below base, the driver's network namespaces,
// and files in the VMMs' TMPDIR.
func (e *env) leftovers() []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, p := range procs {
		if exe, err := os.Readlink(p); err == nil && exe == shared.fakech {
			out = append(out, "process "+p)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], e.base) {
				out = append(out, "mount "+f[4])
			}
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		if b, err := os.ReadFile(l); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), e.base) {
			out = append(out, "loop device "+l+" of "+strings.TrimSpace(string(b)))
		}
	}
	if ents, _ := os.ReadDir("/run/netns"); len(ents) > 0 {
		for _, x := range ents {
			if strings.HasPrefix(x.Name(), e.d.NetNamespace("")) {
				out = append(out, "network namespace "+x.Name())
			}
		}
	}
	if ents, _ := os.ReadDir(e.vmmTmp); len(ents) > 0 {
		for _, x := range ents {
			out = append(out, "VMM temp "+x.Name())
		}
	}
	return out
}

func newID() string { return "g" + strings.ToLower(rand.Text()[:10]) }

func unixGetsid(pid int) (int, error) { return unix.Getsid(pid) }

func (e *env) agentOfDriver(d *cloudhv.Driver, id string) *agent.Client {
	return agent.NewDialClient(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, id) })
}
