package guest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/agent"
	"wb/desktop/guest"
	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/wbbin"
)

// agentExecer is the Execer a node gives the desktop, straight from the guest's agent.
type agentExecer struct{ c *agent.Client }

func (a agentExecer) Exec(ctx context.Context, argv []string, stdin []byte) ([]byte, []byte, int, error) {
	res, err := a.c.Exec(ctx, agent.ExecRequest{Argv: argv, Stdin: stdin, TimeoutS: 300}, nil)
	if err != nil {
		return nil, nil, 0, err
	}
	return []byte(res.Stdout), []byte(res.Stderr), res.ExitCode, nil
}

// desktopEnv is one driver, the templates and the wb binary, shared by a test's guests.
type desktopEnv struct {
	t     testing.TB
	d     *oci.Driver
	tpl   templates.Template
	wbBin string
}

type desktopGuest struct {
	spec  hypervisor.Spec
	agent *agent.Client
	ex    guest.Execer
}

func randHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// reachableTempDir is a t.TempDir that runc's guest root (an unprivileged host uid) can
// search, its parent included.
func reachableTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newEnv needs root, the runtime and the desktop's Debian packages (scripts/deps.sh).
func newEnv(t testing.TB, runtime string) *desktopEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the desktop guest tests need root (runtimes create cgroups and namespaces)")
	}
	if _, err := exec.LookPath(runtime); err != nil {
		t.Fatalf("%s is not installed: run scripts/deps.sh", runtime)
	}
	base := reachableTempDir(t)
	cat, err := templates.Assemble(filepath.Join(base, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	tpl, ok := cat[guest.Template]
	if !ok {
		t.Fatalf("no %s: the host lacks some of %v (run scripts/deps.sh)", guest.Template, templates.DesktopPrograms())
	}
	binDir := filepath.Join(base, "bin")
	if err := os.Mkdir(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	wbBin, err := wbbin.Agent(binDir) // what a node puts in guests
	if err != nil {
		t.Fatal(err)
	}
	d, err := oci.New(oci.Options{
		Runtime:      runtime,
		StateRoot:    filepath.Join(base, "state"),
		BundleRoot:   filepath.Join(base, "bundles"),
		CgroupParent: "/wbtest-desk-" + randHex(t, 4),
		Logger:       slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.RemoveCgroupParent(); err != nil {
			t.Logf("remove cgroup parent: %v", err)
		}
	})
	return &desktopEnv{t: t, d: d, tpl: tpl, wbBin: wbBin}
}

// spec is a desktop guest's spec, as the node makes one (the agent is init).
func (e *desktopEnv) spec() hypervisor.Spec {
	dir := reachableTempDir(e.t)
	return hypervisor.Spec{
		ID: "d" + randHex(e.t, 6), RootFS: e.tpl.RootFS,
		Writable: filepath.Join(dir, "writable"), AgentDir: filepath.Join(dir, "agent"),
		AgentBin: e.wbBin, AgentSocket: "agent.sock",
		Args:          []string{hypervisor.GuestAgentBin, "agent", "--socket", hypervisor.GuestAgentDir + "/agent.sock", "--root", hypervisor.GuestWorkspace},
		Env:           e.tpl.Env,
		ReadOnlyBinds: e.tpl.Binds,
		VCPU:          2, MemoryMiB: 2048, DiskGiB: 2, Pids: 1024,
	}
}

// track stops and deletes the guest when the test ends.
func (e *desktopEnv) track(s hypervisor.Spec) {
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.d.Stop(ctx, s.ID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			e.t.Logf("cleanup stop %s: %v", s.ID, err)
		}
		if err := e.d.Delete(ctx, s.ID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			e.t.Errorf("cleanup delete %s: %v", s.ID, err)
		}
	})
}

// boot creates and boots a fresh desktop guest and waits for its agent.
func (e *desktopEnv) boot(ctx context.Context) *desktopGuest {
	e.t.Helper()
	s := e.spec()
	e.track(s)
	if err := e.d.Create(ctx, s); err != nil {
		e.t.Fatal(err)
	}
	if err := e.d.Boot(ctx, s.ID); err != nil {
		e.t.Fatal(err)
	}
	return e.attach(ctx, s)
}

// attach waits for the agent of the running guest s.
func (e *desktopEnv) attach(ctx context.Context, s hypervisor.Spec) *desktopGuest {
	e.t.Helper()
	c := agent.NewClient(filepath.Join(s.AgentDir, "agent.sock"))
	e.t.Cleanup(c.Close)
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Health(hctx)
		cancel()
		if err == nil {
			break
		}
		if info, ierr := e.d.Info(ctx, s.ID); ctx.Err() != nil || ierr == nil && info.State == hypervisor.StateStopped {
			con, _ := os.ReadFile(e.d.ConsoleLog(s.ID))
			e.t.Fatalf("the agent of %s never answered (%+v): %v\nconsole:\n%s", s.ID, info, err, con)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &desktopGuest{spec: s, agent: c, ex: agentExecer{c}}
}
