package image

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/templates"
)

// vmModulesWithDeps is a kernel package's modules as fakeKernelDeb makes them: the ones the
// VM needs and what they depend on, as in Debian's 6.1 cloud kernel.
func vmModulesWithDeps() map[string][]string {
	return map[string][]string{
		"virtio": nil, "virtio_ring": nil, "virtio_pci_modern_dev": nil, "virtio_pci_legacy_dev": nil,
		"virtio_pci":     {"virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio"},
		"virtio_blk":     {"virtio", "virtio_ring"},
		"virtio_console": {"virtio", "virtio_ring"},
		"failover":       nil, "net_failover": {"failover"},
		"virtio_net":                        {"virtio_ring", "virtio", "net_failover"},
		"vsock":                             nil,
		"vmw_vsock_virtio_transport_common": {"vsock"},
		"vmw_vsock_virtio_transport":        {"virtio", "vmw_vsock_virtio_transport_common", "virtio_ring", "vsock"},
		"virtio_balloon":                    {"virtio", "virtio_ring"},
		"virtio_mem":                        {"virtio", "virtio_ring"},
		"unrelated":                         {"virtio"}, // in the package, not in the initramfs
	}
}

func fakeWB(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "wb")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho fake wb\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkManifestFiles: every file the manifest names has the digest and size it says.
func checkManifestFiles(t *testing.T, dir string, m Manifest) {
	t.Helper()
	files := []File{m.Kernel, m.RootFS, m.WB}
	if m.Initramfs != nil {
		files = append(files, *m.Initramfs)
	}
	for _, f := range files {
		p := f.Path
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Errorf("manifest names %s: %v", f.Path, err)
			continue
		}
		if got := sha256Hex(t, p); got != f.SHA256 || fi.Size() != f.Size {
			t.Errorf("%s: sha256 %s size %d, manifest says %s %d", f.Path, got, fi.Size(), f.SHA256, f.Size)
		}
	}
}

// checkRootFS: the image's layout is what the agent's VM mode needs, read with debugfs.
func checkRootFS(t *testing.T, img, wb string) {
	t.Helper()
	want, err := os.ReadFile(wb)
	if err != nil {
		t.Fatal(err)
	}
	bin, ok := debugfsStat(t, img, hypervisor.GuestAgentBin)
	if !ok || bin.Type != "regular" || bin.Mode != 0o755 || bin.UID != 0 {
		t.Errorf("%s: %+v (found %v); want a root-owned 0755 file", hypervisor.GuestAgentBin, bin, ok)
	}
	if got := debugfsCat(t, img, hypervisor.GuestAgentBin); !bytes.Equal(got, want) {
		t.Errorf("%s in the image is not the wb binary (%d bytes, want %d)", hypervisor.GuestAgentBin, len(got), len(want))
	}
	if init, ok := debugfsStat(t, img, "/sbin/init"); !ok || init.Type != "symlink" || init.Link != hypervisor.GuestAgentBin {
		t.Errorf("/sbin/init: %+v (found %v); want a link to %s", init, ok, hypervisor.GuestAgentBin)
	}
	for _, d := range []string{"/proc", "/sys", "/dev", "/run", agent.VMWritableDir, "/workspace", "/tmp", "/root"} {
		if n, ok := debugfsStat(t, img, d); !ok || n.Type != "directory" {
			t.Errorf("%s: %+v (found %v); want a directory", d, n, ok)
		}
	}
	if sh, ok := debugfsStat(t, img, "/bin/sh"); !ok || sh.Type != "symlink" || sh.Link != "busybox" {
		t.Errorf("/bin/sh: %+v (found %v); want a link to busybox", sh, ok)
	}
	if root, _ := debugfsStat(t, img, "/"); root.UID != 0 {
		t.Errorf("the image's root directory belongs to uid %d", root.UID)
	}
}

// TestBuildWithKernel: `wb image build --kernel PATH` lays out the rootfs, copies the kernel,
// makes no initramfs, and writes a manifest whose digests are the files'.
func TestBuildWithKernel(t *testing.T) {
	t.Parallel()
	needTools(t, "mkfs.ext4", "debugfs")
	ctx := testCtx(t, 3*time.Minute)
	wb := fakeWB(t)
	kernel := filepath.Join(t.TempDir(), "bzImage")
	if err := os.WriteFile(kernel, []byte("a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "img")
	m, err := Build(ctx, Options{Out: out, WB: wb, Kernel: kernel})
	if err != nil {
		t.Fatal(err)
	}
	if m.Initramfs != nil || m.KernelPackage != "" || len(m.Modules) > 0 {
		t.Errorf("a given kernel got an initramfs or a package: %+v", m)
	}
	if _, err := os.Stat(filepath.Join(out, InitramfsFile)); err == nil {
		t.Error("initramfs.img written for a given kernel")
	}
	if got, _ := os.ReadFile(filepath.Join(out, KernelFile)); string(got) != "a kernel" {
		t.Errorf("vmlinuz = %q", got)
	}
	checkManifestFiles(t, out, m)
	checkRootFS(t, filepath.Join(out, RootFSFile), wb)
	if m.Cmdline != Cmdline || !strings.Contains(m.Cmdline, "init="+hypervisor.GuestAgentBin) ||
		!strings.HasSuffix(m.Cmdline, " -- agent --vsock-port "+strconv.Itoa(AgentVsockPort)) {
		t.Errorf("cmdline %q", m.Cmdline)
	}

	// manifest.json is the returned manifest, with paths resolved by ReadManifest.
	read, err := ReadManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	if read.Kernel.Path != filepath.Join(out, KernelFile) || read.RootFS.Path != filepath.Join(out, RootFSFile) {
		t.Errorf("ReadManifest paths: %s, %s", read.Kernel.Path, read.RootFS.Path)
	}
	read.Kernel.Path, read.RootFS.Path = m.Kernel.Path, m.RootFS.Path
	a, _ := json.Marshal(read)
	b, _ := json.Marshal(m)
	if !bytes.Equal(a, b) {
		t.Errorf("manifest.json:\n%s\nreturned:\n%s", a, b)
	}

	// --size sets the disk's size; one too small is refused by mkfs, and says what to do.
	m2, err := Build(ctx, Options{Out: out, WB: wb, Kernel: kernel, Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if m2.RootFS.Size != 64<<20 {
		t.Errorf("--size 64 MiB gave a %d-byte disk", m2.RootFS.Size)
	}
	big := filepath.Join(t.TempDir(), "wb-big")
	if err := os.WriteFile(big, bytes.Repeat([]byte{1}, 3<<20), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(ctx, Options{Out: out, WB: big, Kernel: kernel, Size: 2 << 20}); err == nil || !strings.Contains(err.Error(), "--size") {
		t.Errorf("a 2 MiB disk for a 3 MiB binary: %v", err)
	}
}

// TestBuildFromKernelDeb: the kernel comes from a linux-image .deb, and the initramfs holds
// busybox, /init and exactly the VM's modules, each after those it depends on.
func TestBuildFromKernelDeb(t *testing.T) {
	t.Parallel()
	needTools(t, "mkfs.ext4", "debugfs", "dpkg-deb")
	ctx := testCtx(t, 3*time.Minute)
	deb := fakeKernelDeb(t, vmModulesWithDeps())
	out := t.TempDir()
	wb := fakeWB(t)
	m, err := Build(ctx, Options{Out: out, WB: wb, KernelDeb: deb})
	if err != nil {
		t.Fatal(err)
	}
	if m.KernelPackage != "linux-image-6.1.0-99-cloud-amd64" || m.KernelVersion != "6.1.999-1" {
		t.Errorf("kernel package %q version %q", m.KernelPackage, m.KernelVersion)
	}
	if got, _ := os.ReadFile(filepath.Join(out, KernelFile)); string(got) != "fake bzImage" {
		t.Errorf("vmlinuz = %q, want the package's boot/vmlinuz-*", got)
	}
	if m.Initramfs == nil {
		t.Fatal("no initramfs")
	}
	checkManifestFiles(t, out, m)
	checkRootFS(t, filepath.Join(out, RootFSFile), wb)

	files, _ := readCPIO(t, filepath.Join(out, m.Initramfs.Path))
	if string(files["init"]) != initScript {
		t.Error("the initramfs's /init is not initScript")
	}
	if bb, _ := findBusybox(""); !bytes.Equal(files["bin/busybox"], mustRead(t, bb)) {
		t.Error("the initramfs's /bin/busybox is not busybox")
	}
	listed := strings.Fields(string(files["modules"]))
	if !slices.Equal(listed, m.Modules) {
		t.Errorf("/modules lists %v, manifest %v", listed, m.Modules)
	}
	deps := vmModulesWithDeps()
	pos := map[string]int{}
	for i, mod := range m.Modules {
		pos[mod] = i
		if _, ok := files["lib/modules/"+mod+".ko"]; !ok {
			t.Errorf("module %s listed but not in the initramfs", mod)
		}
	}
	for _, want := range vmModules() {
		if _, ok := pos[want]; !ok {
			t.Errorf("module %s missing", want)
		}
	}
	for mod, ds := range deps {
		for _, d := range ds {
			if _, ok := pos[mod]; ok && pos[d] >= pos[mod] {
				t.Errorf("%s loads before its dependency %s", mod, d)
			}
		}
	}
	if _, ok := pos["unrelated"]; ok {
		t.Error("a module the VM does not need is in the initramfs")
	}
	if out, err := exec.Command("busybox", "sh", "-n", "-c", initScript).CombinedOutput(); err != nil {
		t.Errorf("/init does not parse: %v\n%s", err, out)
	}

	// A package without one of the needed modules is refused, naming it.
	short := vmModulesWithDeps()
	delete(short, "virtio_ring")
	if _, err := Build(ctx, Options{Out: t.TempDir(), WB: wb, KernelDeb: fakeKernelDeb(t, short)}); err == nil || !strings.Contains(err.Error(), "virtio_ring") {
		t.Errorf("a package without virtio_ring: %v", err)
	}
}

// dynamicBinary is a dynamically linked ELF executable of the host's.
func dynamicBinary(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/dpkg", "/usr/bin/env", "/bin/ls"} {
		if f, err := elf.Open(p); err == nil {
			dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
			f.Close()
			if dynamic {
				return p
			}
		}
	}
	t.Skip("no dynamically linked binary on this host")
	return ""
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBuildErrors: missing inputs are named, with the flag that gives them.
func TestBuildErrors(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	wb := fakeWB(t)
	missing := filepath.Join(t.TempDir(), "nope")
	for _, c := range []struct {
		name string
		o    Options
		want []string
	}{
		{"no out", Options{WB: wb, Kernel: wb}, []string{"--out"}},
		{"no wb", Options{Out: t.TempDir(), Kernel: wb}, []string{"wb binary", "--wb"}},
		{"missing wb", Options{Out: t.TempDir(), WB: missing, Kernel: wb}, []string{"--wb", missing}},
		{"wb a directory", Options{Out: t.TempDir(), WB: t.TempDir(), Kernel: wb}, []string{"--wb", "not a regular file"}},
		{"missing kernel", Options{Out: t.TempDir(), WB: wb, Kernel: missing}, []string{"--kernel", missing}},
		{"missing kernel deb", Options{Out: t.TempDir(), WB: wb, KernelDeb: missing}, []string{"--kernel-deb", missing}},
		{"both kernels", Options{Out: t.TempDir(), WB: wb, Kernel: wb, KernelDeb: wb}, []string{"--kernel", "--kernel-deb"}},
		{"dynamic wb", Options{Out: t.TempDir(), WB: dynamicBinary(t), Kernel: wb}, []string{"--wb", "dynamically linked", "CGO_ENABLED=0"}},
		{"odd size", Options{Out: t.TempDir(), WB: wb, Kernel: wb, Size: 1000}, []string{"--size"}},
	} {
		_, err := Build(ctx, c.o)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v does not name %q", c.name, err, w)
			}
		}
	}
}

// TestKernelDownload fetches the current linux-image-cloud-amd64 kernel with apt-get (the .deb
// cached in the user's cache dir, not the repository) and builds an initramfs with its real
// modules. Skipped when apt cannot reach the mirror.
func TestKernelDownload(t *testing.T) {
	t.Parallel()
	needTools(t, "apt-get", "dpkg-deb", "mkfs.ext4")
	if testing.Short() {
		t.Skip("downloads a kernel package")
	}
	ctx := testCtx(t, 5*time.Minute)
	cacheRoot, err := os.UserCacheDir()
	if err != nil {
		t.Skip(err)
	}
	cache := filepath.Join(cacheRoot, "wb-test", "kernel-debs")
	out := t.TempDir()
	m, err := Build(ctx, Options{Out: out, WB: fakeWB(t), CacheDir: cache})
	if err != nil {
		if strings.Contains(err.Error(), "apt-get download") {
			t.Skipf("apt cannot fetch the kernel: %v", err)
		}
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.KernelPackage, "linux-image-") || !strings.HasSuffix(m.KernelPackage, "-cloud-amd64") || m.KernelVersion == "" {
		t.Errorf("kernel package %q version %q", m.KernelPackage, m.KernelVersion)
	}
	// A bzImage: the boot protocol's "HdrS" magic at 0x202.
	k := mustRead(t, filepath.Join(out, KernelFile))
	if len(k) < 0x206 || string(k[0x202:0x206]) != "HdrS" {
		t.Error("vmlinuz is not a bzImage")
	}
	if m.Initramfs == nil || !slices.Contains(m.Modules, "virtio_blk") || !slices.Contains(m.Modules, "vmw_vsock_virtio_transport") {
		t.Errorf("initramfs %v modules %v", m.Initramfs, m.Modules)
	}
	checkManifestFiles(t, out, m)
	debs, _ := filepath.Glob(filepath.Join(cache, m.KernelPackage+"_*.deb"))
	if len(debs) != 1 {
		t.Errorf("cache holds %v, want the kernel's .deb", debs)
	}
}

// TestRootFSImage: a template directory plus the wb binary become an ext4 image with the
// binary as init, reused while both are unchanged; the template itself is left as it was.
func TestRootFSImage(t *testing.T) {
	t.Parallel()
	needTools(t, "mkfs.ext4", "debugfs", "cp")
	ctx := testCtx(t, 3*time.Minute)
	cat, err := templates.AssembleWith(t.TempDir(), templates.Options{HostRoot: t.TempDir()}) // no host toolchains
	if err != nil {
		t.Fatal(err)
	}
	tpl := cat[templates.Base].RootFS
	before, err := templates.Digest(tpl, nil)
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	wb := fakeWB(t)
	img, err := RootFSImage(ctx, cache, tpl, wb)
	if err != nil {
		t.Fatal(err)
	}
	checkRootFS(t, img, wb)
	if after, _ := templates.Digest(tpl, nil); after != before {
		t.Error("RootFSImage changed the template")
	}
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}

	// Unchanged inputs: the same image, not rebuilt.
	again, err := RootFSImage(ctx, cache, tpl, wb)
	if err != nil {
		t.Fatal(err)
	}
	fi2, err := os.Stat(again)
	if err != nil {
		t.Fatal(err)
	}
	if again != img || !os.SameFile(fi, fi2) || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Errorf("unchanged inputs rebuilt the image: %s then %s", img, again)
	}
	// Another binary: another image.
	wb2 := fakeWB(t)
	if err := os.WriteFile(wb2, []byte("another wb"), 0o755); err != nil {
		t.Fatal(err)
	}
	other, err := RootFSImage(ctx, cache, tpl, wb2)
	if err != nil {
		t.Fatal(err)
	}
	if other == img {
		t.Error("a new wb binary reused the old image")
	}
	checkRootFS(t, other, wb2)
	if left, _ := filepath.Glob(filepath.Join(cache, ".rootfs-*")); len(left) > 0 {
		t.Errorf("scratch dirs left in the cache: %v", left)
	}

	if _, err := RootFSImage(ctx, cache, tpl, filepath.Join(t.TempDir(), "nope")); err == nil || !strings.Contains(err.Error(), "wb binary") {
		t.Errorf("missing wb binary: %v", err)
	}
}

// TestWritableDisk: the writable disk holds hypervisor.WritableMounts' directories with
// their modes, owned by root.
func TestWritableDisk(t *testing.T) {
	t.Parallel()
	needTools(t, "mkfs.ext4", "debugfs")
	img := filepath.Join(t.TempDir(), "writable.ext4")
	if err := WritableDisk(testCtx(t, time.Minute), img, 32<<20); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(img); err != nil || fi.Size() != 32<<20 {
		t.Fatalf("writable disk: %v, %v", fi, err)
	}
	for _, w := range hypervisor.WritableMounts() {
		n, ok := debugfsStat(t, img, "/"+w.Subdir)
		if !ok || n.Type != "directory" || n.Mode != w.Mode || n.UID != 0 {
			t.Errorf("%s: %+v (found %v); want a root-owned directory of mode %#o", w.Subdir, n, ok, w.Mode)
		}
	}
	if err := WritableDisk(testCtx(t, time.Minute), img, 1<<20); err == nil || !strings.Contains(err.Error(), "size") {
		t.Errorf("a 1 MiB writable disk: %v", err)
	}
}

func TestFirstDependency(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][2]string{
		"linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)":            {"linux-image-6.1.0-57-cloud-amd64", "6.1.192-3"},
		"linux-image-6.12.1-cloud-amd64 (= 6.12.1-1), other (>= 1)": {"linux-image-6.12.1-cloud-amd64", "6.12.1-1"},
		"linux-image-a | linux-image-b":                             {"linux-image-a", ""},
		"linux-image-x (>= 2)":                                      {"linux-image-x", ""},
	} {
		pkg, version := firstDependency(in)
		if pkg != want[0] || version != want[1] {
			t.Errorf("firstDependency(%q) = %q, %q; want %q, %q", in, pkg, version, want[0], want[1])
		}
	}
}

// TestFilesystemUUID: an image's UUID is what blkid reads from it; a copy keeps it, another
// mkfs.ext4 of the same dir does not, and a file that is no ext4 image is refused.
func TestFilesystemUUID(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("needs mkfs.ext4")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(filepath.Join(src, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(dir, "a.ext4"), filepath.Join(dir, "b.ext4")
	for _, img := range []string{a, b} {
		if err := mkfs(t.Context(), src, img, "t", 8*mib); err != nil {
			t.Fatal(err)
		}
	}
	ua, err := FilesystemUUID(a)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("blkid", "-s", "UUID", "-o", "value", a).Output(); err == nil && strings.TrimSpace(string(out)) != ua {
		t.Errorf("FilesystemUUID = %s; blkid says %s", ua, strings.TrimSpace(string(out)))
	}
	if ub, err := FilesystemUUID(b); err != nil || ub == ua {
		t.Errorf("another mkfs of the same dir: %s, %v; want a UUID other than %s", ub, err, ua)
	}
	c := filepath.Join(dir, "c.ext4")
	if err := copyFile(a, c, 0o644); err != nil {
		t.Fatal(err)
	}
	if uc, err := FilesystemUUID(c); err != nil || uc != ua {
		t.Errorf("a copy: %s, %v; want %s", uc, err, ua)
	}
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	if u, err := FilesystemUUID(junk); err == nil {
		t.Errorf("a file of zeros: %s; want an error", u)
	}
}
