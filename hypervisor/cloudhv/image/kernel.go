package image

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// KernelMetaPackage is the Debian package whose dependency is the current cloud kernel.
const KernelMetaPackage = "linux-image-cloud-amd64"

// kernel is an unpacked kernel package: the image to boot and its modules.
type kernel struct {
	vmlinuz string // the bzImage
	pkg     string // Debian package name, e.g. linux-image-6.1.0-57-cloud-amd64
	version string // its version, e.g. 6.1.192-3
	modules string // its lib/modules/<release> directory
}

// downloadKernelDeb fetches the current cloud kernel's .deb into cacheDir with apt-get (the
// meta package names it) unless that package and version is there already, and returns its
// path.
func downloadKernelDeb(ctx context.Context, log *slog.Logger, cacheDir string) (string, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("image: kernel cache: %w", err)
	}
	// The meta package is tiny; fetching it is how the current kernel package is learnt.
	meta, err := aptDownload(ctx, cacheDir, KernelMetaPackage)
	if err != nil {
		return "", err
	}
	depends, err := debField(ctx, meta, "Depends")
	if err != nil {
		return "", err
	}
	pkg, version := firstDependency(depends)
	if !strings.HasPrefix(pkg, "linux-image-") {
		return "", fmt.Errorf("image: %s depends on %q, not on a linux-image package; give --kernel-deb", KernelMetaPackage, depends)
	}
	if cached := cachedDeb(ctx, cacheDir, pkg, version); cached != "" {
		log.Info("image: kernel package cached", "deb", cached)
		return cached, nil
	}
	want := pkg
	if version != "" {
		want = pkg + "=" + version
	}
	return aptDownload(ctx, cacheDir, want)
}

// aptDownload runs `apt-get download spec` in a scratch dir below dir and moves the .deb it
// wrote into dir.
func aptDownload(ctx context.Context, dir, spec string) (string, error) {
	scratch, err := os.MkdirTemp(dir, ".download-")
	if err != nil {
		return "", fmt.Errorf("image: kernel cache: %w", err)
	}
	defer os.RemoveAll(scratch)
	cmd := exec.CommandContext(ctx, "apt-get", "download", spec)
	cmd.Dir = scratch
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("image: apt-get download %s (run apt-get update first, or give --kernel-deb or --kernel): %w\n%s", spec, err, strings.TrimSpace(out.String()))
	}
	debs, _ := filepath.Glob(filepath.Join(scratch, "*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("image: apt-get download %s wrote %d .debs, want one", spec, len(debs))
	}
	dst := filepath.Join(dir, filepath.Base(debs[0]))
	if err := os.Rename(debs[0], dst); err != nil {
		return "", fmt.Errorf("image: kernel cache: %w", err)
	}
	return dst, nil
}

func debsIn(dir string) []string {
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	return debs
}

// cachedDeb is the .deb of pkg at version in dir, if one is there and reads as that.
func cachedDeb(ctx context.Context, dir, pkg, version string) string {
	for _, d := range debsIn(dir) {
		if !strings.HasPrefix(filepath.Base(d), pkg+"_") {
			continue
		}
		if v, err := debField(ctx, d, "Version"); err == nil && (version == "" || v == version) {
			return d
		}
	}
	return ""
}

// debField is one control field of a .deb.
func debField(ctx context.Context, deb, field string) (string, error) {
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb, field).Output()
	if err != nil {
		return "", fmt.Errorf("image: dpkg-deb -f %s %s: %w", deb, field, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// firstDependency parses the first package of a Depends field, and its version when pinned
// with "=": "linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3), x" → the name, "6.1.192-3".
func firstDependency(depends string) (pkg, version string) {
	first, _, _ := strings.Cut(depends, ",")
	first, _, _ = strings.Cut(first, "|")
	first = strings.TrimSpace(first)
	name, constraint, ok := strings.Cut(first, "(")
	pkg = strings.TrimSpace(name)
	if ok {
		c := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(constraint), ")"))
		if v, ok := strings.CutPrefix(c, "="); ok {
			version = strings.TrimSpace(v)
		}
	}
	return pkg, version
}

// unpackKernel extracts deb into dir (dpkg-deb -x) and finds its kernel and modules.
func unpackKernel(ctx context.Context, deb, dir string) (kernel, error) {
	if _, err := os.Stat(deb); err != nil {
		return kernel{}, fmt.Errorf("image: --kernel-deb: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, dir).CombinedOutput(); err != nil {
		return kernel{}, fmt.Errorf("image: dpkg-deb -x %s: %w\n%s", deb, err, out)
	}
	var k kernel
	var err error
	if k.pkg, err = debField(ctx, deb, "Package"); err != nil {
		return k, err
	}
	if k.version, err = debField(ctx, deb, "Version"); err != nil {
		return k, err
	}
	vmlinuz, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(vmlinuz) != 1 {
		return k, fmt.Errorf("image: %s holds %d boot/vmlinuz-* files, want one: is it a linux-image package (e.g. the dependency of %s)?", deb, len(vmlinuz), KernelMetaPackage)
	}
	k.vmlinuz = vmlinuz[0]
	release := strings.TrimPrefix(filepath.Base(k.vmlinuz), "vmlinuz-")
	for _, d := range []string{"lib/modules", "usr/lib/modules"} { // before and after merged /usr
		p := filepath.Join(dir, d, release)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			k.modules = p
			break
		}
	}
	if k.modules == "" {
		return k, fmt.Errorf("image: %s has no lib/modules/%s: %w", deb, release, fs.ErrNotExist)
	}
	return k, nil
}
