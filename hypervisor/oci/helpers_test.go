package oci_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
)

// runtimes are the OCI runtimes every test runs against; both must be installed.
func runtimes() []string { return []string{oci.RuntimeRunsc, oci.RuntimeRunc} }

func randHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newDriver returns a driver with its own state root, bundle root and cgroup parent, each
// of edit applied to its options. A missing runtime fails the test with an install hint.
func newDriver(t testing.TB, runtime string, edit ...func(*oci.Options)) *oci.Driver {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("the OCI driver tests need root (runtimes create cgroups and namespaces)")
	}
	if _, err := exec.LookPath(runtime); err != nil {
		t.Fatalf("%s is not installed: apt-get install -y %s (Debian 12 package %q)", runtime, runtime, runtime)
	}
	base := t.TempDir()
	o := oci.Options{
		Runtime:      runtime,
		StateRoot:    filepath.Join(base, "state"),
		BundleRoot:   filepath.Join(base, "bundles"),
		CgroupParent: "/wbtest-" + randHex(t, 4),
		Logger:       slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, e := range edit {
		e(&o)
	}
	d, err := oci.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name() != runtime {
		t.Fatalf("driver name %q, want %q", d.Name(), runtime)
	}
	// Runs after the test's guests were deleted (track's cleanups come later, so run first):
	// a guest's cgroup left behind keeps its parent, and fails the test.
	t.Cleanup(func() {
		if err := d.RemoveCgroupParent(); err != nil {
			t.Errorf("a guest's cgroup is left after its delete: remove the cgroup parent: %v", err)
		}
	})
	return d
}

// catalog assembles the templates once per test.
func catalog(t testing.TB) templates.Catalog {
	t.Helper()
	dir := reachableTempDir(t)
	cat, err := templates.Assemble(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cat
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

// jobRunner is the test's stand-in for the agent: it announces readiness, then runs every
// /run/wb/jobs/NAME.sh and leaves NAME.rc and NAME.out in /run/wb/out.
const jobRunner = `mkdir -p /run/wb/jobs /run/wb/out
echo ready > /run/wb/ready
while :; do
  for j in /run/wb/jobs/*.sh; do
    [ -e "$j" ] || continue
    n=${j##*/}; n=${n%.sh}
    sh "$j" > /run/wb/out/$n.tmp 2>&1
    echo $? > /run/wb/out/$n.rc
    mv /run/wb/out/$n.tmp /run/wb/out/$n.out
    rm -f "$j"
  done
  sleep 0.1
done`

type guest struct {
	t    testing.TB
	d    *oci.Driver
	spec hypervisor.Spec
}

// guestSpec builds a spec on template tpl with fresh host dirs.
func guestSpec(t testing.TB, tpl templates.Template, script string) hypervisor.Spec {
	t.Helper()
	dir := reachableTempDir(t)
	return hypervisor.Spec{
		ID:            "t" + randHex(t, 6),
		RootFS:        tpl.RootFS,
		Writable:      filepath.Join(dir, "writable"),
		AgentDir:      filepath.Join(dir, "agent"),
		Args:          []string{"/bin/sh", "-c", script},
		Env:           tpl.Env,
		ReadOnlyBinds: tpl.Binds,
		VCPU:          1,
		MemoryMiB:     256,
		DiskGiB:       1,
		Pids:          128,
	}
}

// track makes sure the guest is stopped and deleted when the test ends, even on failure.
func track(t testing.TB, d *oci.Driver, s hypervisor.Spec) *guest {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx, s.ID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			t.Logf("cleanup stop %s: %v", s.ID, err)
		}
		if err := d.Delete(ctx, s.ID); err != nil {
			t.Errorf("cleanup delete %s: %v", s.ID, err)
		}
	})
	return &guest{t: t, d: d, spec: s}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFile polls for path until it exists (and, when want != "", holds want), or fails.
func waitFile(t testing.TB, path string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within %v: %v", path, timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// run executes a shell script in the guest through the job runner and returns its exit code
// and combined output.
func (g *guest) run(script string) (int, string) {
	g.t.Helper()
	name := "j" + randHex(g.t, 4)
	jobs := filepath.Join(g.spec.AgentDir, "jobs")
	if err := os.MkdirAll(jobs, 0o755); err != nil {
		g.t.Fatal(err)
	}
	tmp := filepath.Join(jobs, "."+name)
	if err := os.WriteFile(tmp, []byte(script+"\n"), 0o644); err != nil {
		g.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(jobs, name+".sh")); err != nil {
		g.t.Fatal(err)
	}
	// Three minutes: TestDiskLimit's job writes 1.2 GB through runsc's gofer, which took over
	// a minute in a cold make test (packages side by side on 2 cores).
	out := waitFile(g.t, filepath.Join(g.spec.AgentDir, "out", name+".out"), 3*time.Minute)
	rcs, err := os.ReadFile(filepath.Join(g.spec.AgentDir, "out", name+".rc"))
	if err != nil {
		g.t.Fatal(err)
	}
	rc, err := strconv.Atoi(strings.TrimSpace(string(rcs)))
	if err != nil {
		g.t.Fatal(err)
	}
	return rc, out
}

// mustRun is run that fails the test on a non-zero exit.
func (g *guest) mustRun(script string) string {
	g.t.Helper()
	rc, out := g.run(script)
	if rc != 0 {
		g.t.Fatalf("guest job %q: exit %d: %s", script, rc, out)
	}
	return out
}

// boot creates and boots s, waits for the job runner, and returns the guest and latencies.
func boot(t testing.TB, d *oci.Driver, s hypervisor.Spec) (g *guest, create, start, ready time.Duration) {
	t.Helper()
	ctx := ctxT(t, 3*time.Minute) // create and boot, on a cold, busy machine
	g = track(t, d, s)
	t0 := time.Now()
	if err := d.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if err := d.Boot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	waitFile(t, filepath.Join(s.AgentDir, "ready"), 2*time.Minute)
	return g, t1.Sub(t0), t2.Sub(t1), time.Since(t0)
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func shJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shQuote(a)
	}
	return strings.Join(q, " ")
}

func readInt(t testing.TB, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return -1 // not written yet
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1 // caught mid-write
	}
	return n
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
