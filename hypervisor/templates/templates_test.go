package templates_test

import (
	"os"
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
	if got := cat.Names(); !slices.Equal(got, []string{templates.Base, templates.DevPolyglot}) {
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
	if len(ents) != 2 {
		t.Errorf("template dir holds %d entries, want 2 (no scratch dirs left)", len(ents))
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
		names = append(names, r.Name)
	}
	t.Logf("tpl_dev_polyglot runtimes %v, binds %v", names, poly.Binds)
}
