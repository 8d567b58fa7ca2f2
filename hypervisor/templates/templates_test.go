package templates_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"wb/hypervisor"
	"wb/hypervisor/templates"
)

func TestAssemble(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Fatalf("busybox is not installed: apt-get install -y busybox-static (%v)", err)
	}
	dir := t.TempDir()
	cat, err := templates.Assemble(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{templates.Base, templates.DevPolyglot}
	if _, ok := cat[templates.Desktop]; ok {
		want = []string{templates.Base, templates.Desktop, templates.DevPolyglot}
	}
	if got := cat.Names(); !slices.Equal(got, want) {
		t.Fatalf("names = %v", got)
	}
	base := cat[templates.Base]
	if !strings.HasPrefix(base.Digest, "sha256:") || len(base.Digest) != len("sha256:")+64 {
		t.Fatalf("digest %q", base.Digest)
	}
	if len(base.Binds) != 0 || !slices.ContainsFunc(base.Runtimes, func(r templates.Runtime) bool {
		return r.Name == "sh" && slices.Equal(r.Argv, []string{"/bin/sh", "-c"})
	}) {
		t.Fatalf("base = %+v", base)
	}
	for _, a := range []string{"sh", "ls", "cat", "echo", "sleep", "head", "tr", "stty", "ps", "wc", "nc", "awk"} {
		if l, err := os.Readlink(filepath.Join(base.RootFS, "bin", a)); err != nil || l != "busybox" {
			t.Errorf("/bin/%s: %q %v", a, l, err)
		}
	}
	for _, d := range []string{"workspace", "tmp", "root", "proc", "dev", "sys", "run/wb", "run/wb-bin", "etc"} {
		if fi, err := os.Stat(filepath.Join(base.RootFS, d)); err != nil || !fi.IsDir() {
			t.Errorf("/%s is not a directory: %v", d, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(base.RootFS, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("/tmp is not sticky: %v", fi.Mode())
	}
	if fi, err := os.Stat(filepath.Join(base.RootFS, strings.TrimPrefix(hypervisor.GuestAgentBin, "/"))); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("agent bin mount point: %v", err)
	}
	for _, f := range []string{"etc/passwd", "etc/group", "etc/hosts"} {
		if b, err := os.ReadFile(filepath.Join(base.RootFS, f)); err != nil || len(b) == 0 {
			t.Errorf("/%s: %v", f, err)
		}
	}

	// Deterministic: a rebuild in the same dir reuses the tree; another dir gives the same digests.
	again, err := templates.Assemble(dir)
	if err != nil {
		t.Fatal(err)
	}
	other, err := templates.Assemble(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range cat.Names() {
		if again[n].Digest != cat[n].Digest || again[n].RootFS != cat[n].RootFS || other[n].Digest != cat[n].Digest {
			t.Errorf("%s: digests %s / %s / %s, rootfs %s / %s", n, cat[n].Digest, again[n].Digest, other[n].Digest, cat[n].RootFS, again[n].RootFS)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != len(want) {
		t.Errorf("template dir holds %d entries, want %d (no scratch dirs left)", len(ents), len(want))
	}

	// The digest covers contents and binds.
	d0, err := templates.Digest(base.RootFS, nil)
	if err != nil || d0 != base.Digest {
		t.Fatalf("Digest = %s, %v; want %s", d0, err, base.Digest)
	}
	if d1, _ := templates.Digest(base.RootFS, []hypervisor.Bind{{Source: "/usr", Target: "/usr"}}); d1 == d0 {
		t.Error("digest ignores binds")
	}
	cp := t.TempDir()
	if err := os.CopyFS(cp, os.DirFS(base.RootFS)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cp, "etc", "hosts"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if d2, _ := templates.Digest(cp, nil); d2 == d0 {
		t.Error("digest ignores file contents")
	}

	poly := cat[templates.DevPolyglot]
	if poly.Digest == base.Digest {
		t.Error("polyglot digest equals base digest")
	}
	if _, err := os.Stat("/usr/bin"); err == nil {
		if !slices.Contains(poly.Binds, hypervisor.Bind{Source: "/usr", Target: "/usr"}) {
			t.Errorf("polyglot binds %v lack /usr", poly.Binds)
		}
	}
	for _, b := range poly.Binds {
		if _, err := os.Lstat(filepath.Join(poly.RootFS, b.Target)); err != nil {
			t.Errorf("no mount point for bind %s: %v", b.Target, err)
		}
	}
	var names []string
	for _, r := range poly.Runtimes {
		names = append(names, r.Name+" "+r.Version)
	}
	t.Logf("tpl_dev_polyglot runtimes %v, binds %v", names, poly.Binds)
	// Each toolchain's version is the host's own (a run may ask for "python3.11").
	if out, err := exec.Command("/usr/bin/python3", "--version").Output(); err == nil {
		want := strings.TrimPrefix(strings.TrimSpace(string(out)), "Python ")
		i := slices.IndexFunc(poly.Runtimes, func(r templates.Runtime) bool { return r.Name == "python3" })
		if i < 0 || poly.Runtimes[i].Version != want {
			t.Errorf("tpl_dev_polyglot runtimes %v: want python3 at version %s", names, want)
		}
	}
	if out, err := exec.Command("/usr/bin/gcc", "-dumpfullversion").Output(); err == nil {
		want := strings.TrimSpace(string(out))
		if !slices.ContainsFunc(poly.Runtimes, func(r templates.Runtime) bool { return r.Name == "gcc" && r.Version == want }) {
			t.Errorf("tpl_dev_polyglot runtimes %v: want gcc at version %s", names, want)
		}
	}
}

// TestDesktopTemplate: with the desktop's Debian packages installed (scripts/deps.sh), the
// catalog has tpl_desktop: the host's /usr, fontconfig's and Chromium's /etc, and /data on
// the writable disk; without them it has none.
func TestDesktopTemplate(t *testing.T) {
	cat, err := templates.Assemble(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	desk, ok := cat[templates.Desktop]
	if !ok {
		t.Fatalf("no %s: install the desktop's packages (scripts/deps.sh needs %v)", templates.Desktop, templates.DesktopPrograms())
	}
	for _, target := range []string{"/usr", "/etc/fonts", "/etc/chromium.d"} {
		if !slices.ContainsFunc(desk.Binds, func(b hypervisor.Bind) bool { return b.Target == target && b.Source == target }) {
			t.Errorf("binds %v lack %s", desk.Binds, target)
		}
	}
	for _, b := range desk.Binds {
		if _, err := os.Lstat(filepath.Join(desk.RootFS, b.Target)); err != nil {
			t.Errorf("no mount point for bind %s: %v", b.Target, err)
		}
	}
	if l, err := os.Readlink(filepath.Join(desk.RootFS, "data")); err != nil || l != templates.DesktopDataTarget || !strings.HasPrefix(l, hypervisor.GuestWorkspace+"/") {
		t.Errorf("/data -> %q (%v), want a link into the writable %s", l, err, hypervisor.GuestWorkspace)
	}
	if desk.Digest == cat[templates.DevPolyglot].Digest {
		t.Error("desktop digest equals polyglot digest")
	}

	// A host without the programs (here: an empty host root) offers no desktop.
	bare, err := templates.AssembleWith(t.TempDir(), templates.Options{HostRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := bare[templates.Desktop]; ok {
		t.Error("a host without Xvfb and Chromium offers tpl_desktop")
	}
}
