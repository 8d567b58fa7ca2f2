package image

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/templates"
)

// rootfsLayout versions what addAgent puts into a root filesystem: a change to it must change
// the cache key of RootFSImage.
const rootfsLayout = "wb-rootfs-v1"

const mib = 1 << 20

// addAgent makes root a guest root for the agent's VM mode: the wb binary at
// /run/wb-bin/wb (replacing a template's empty mount point for it), /sbin/init → it, and the
// mount points the agent uses.
func addAgent(root, wb string) error {
	for _, d := range []string{"proc", "sys", "dev", "run", "run/wb", "run/wb-bin", strings.TrimPrefix(agent.VMWritableDir, "/")} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("image: rootfs: %w", err)
		}
	}
	for _, w := range hypervisor.WritableMounts() {
		if err := os.MkdirAll(filepath.Join(root, w.Target), fs.FileMode(w.Mode&0o777)); err != nil {
			return fmt.Errorf("image: rootfs: %w", err)
		}
	}
	bin := filepath.Join(root, strings.TrimPrefix(hypervisor.GuestAgentBin, "/"))
	if err := os.Remove(bin); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	if err := copyFile(wb, bin, 0o755); err != nil {
		return fmt.Errorf("image: wb binary: %w", err)
	}
	// /sbin may be a link to bin (the templates have it so); follow it.
	sbin := filepath.Join(root, "sbin")
	if t, err := os.Readlink(sbin); err == nil && !filepath.IsAbs(t) {
		sbin = filepath.Join(root, t)
	}
	if err := os.MkdirAll(sbin, 0o755); err != nil {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	// A template's /sbin/init is busybox's applet, which no guest runs: wb is init.
	init := filepath.Join(sbin, "init")
	if err := os.Remove(init); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	if err := os.Symlink(hypervisor.GuestAgentBin, init); err != nil {
		return fmt.Errorf("image: rootfs: %w", err)
	}
	return nil
}

// mkfs makes an ext4 image at img from the directory dir. size 0 means the content plus
// headroom (contentSize).
func mkfs(ctx context.Context, dir, img, label string, size int64) error {
	if size == 0 {
		content, err := contentSize(dir)
		if err != nil {
			return err
		}
		size = autoSize(content)
	}
	if size%1024 != 0 {
		return fmt.Errorf("image: disk size %d is not a multiple of 1 KiB", size)
	}
	_ = os.Remove(img)
	// -m 0: no blocks reserved for root (one user, and a read-only root); -E root_owner: the
	// image's root directory is root's whoever runs this.
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-L", label, "-E", "root_owner=0:0", "-d", dir, img, fmt.Sprintf("%dk", size/1024))
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(img)
		return fmt.Errorf("image: mkfs.ext4 of %s (%d MiB; too small? give a larger --size): %w\n%s", dir, size/mib, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// contentSize is what dir's files take on ext4: each file rounded up to 4 KiB blocks, plus a
// block per directory and symlink.
func contentSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		total += (fi.Size() + 4095) / 4096 * 4096
		if !fi.Mode().IsRegular() {
			total += 4096
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("image: size of %s: %w", dir, err)
	}
	return total, nil
}

// autoSize is a disk size for content bytes: a quarter more for ext4's metadata (inode tables,
// bitmaps) and 32 MiB for the journal and slack, in whole MiB.
func autoSize(content int64) int64 {
	size := content + content/4 + 32*mib
	return (size + mib - 1) / mib * mib
}

// RootFSImage returns an ext4 image of the template root directory templateRoot with the wb
// binary added as the agent's VM mode expects it (see addAgent), for a Cloud Hypervisor
// guest's read-only rootfs disk. Images are kept in cacheDir under the digest of their inputs
// (the template's content, the binary's, the layout's version), so an unchanged template and
// binary reuse the image; a new one is built in a scratch dir and renamed into place.
// The template's read-only host binds (tpl_dev_polyglot's toolchains) are not in the image.
func RootFSImage(ctx context.Context, cacheDir, templateRoot, wb string) (string, error) {
	if err := checkFile(wb, "wb binary"); err != nil {
		return "", err
	}
	if err := checkStatic(wb, "wb binary"); err != nil {
		return "", err
	}
	tdigest, err := templates.Digest(templateRoot, nil)
	if err != nil {
		return "", fmt.Errorf("image: template %s: %w", templateRoot, err)
	}
	wdigest, _, err := fileSHA256(wb)
	if err != nil {
		return "", fmt.Errorf("image: wb binary: %w", err)
	}
	key := sha256.Sum256([]byte(rootfsLayout + "\x00" + tdigest + "\x00" + wdigest))
	img := filepath.Join(cacheDir, "rootfs-"+hex.EncodeToString(key[:])[:24]+".ext4")
	if _, err := os.Stat(img); err == nil {
		return img, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("image: cache dir: %w", err)
	}
	scratch, err := os.MkdirTemp(cacheDir, ".rootfs-")
	if err != nil {
		return "", fmt.Errorf("image: cache dir: %w", err)
	}
	defer os.RemoveAll(scratch)
	root := filepath.Join(scratch, "root")
	// cp -a keeps modes, links and special files exactly; the template stays untouched.
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--", templateRoot, root).CombinedOutput(); err != nil {
		return "", fmt.Errorf("image: copy template %s: %w\n%s", templateRoot, err, out)
	}
	if err := addAgent(root, wb); err != nil {
		return "", err
	}
	tmp := filepath.Join(scratch, "rootfs.ext4")
	if err := mkfs(ctx, root, tmp, "wb-rootfs", 0); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, img); err != nil {
		return "", fmt.Errorf("image: %w", err)
	}
	return img, nil
}

// FilesystemUUID is the UUID in the superblock of the ext4 image at path: random for each
// mkfs.ext4 run, so two builds of an image from the same inputs differ in it (as they differ in
// layout), while a copy of an image keeps it.
func FilesystemUUID(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("image: %w", err)
	}
	defer f.Close()
	// The superblock starts 1024 bytes in: s_magic at 0x38, s_uuid (16 bytes) at 0x68.
	var sb [0x78]byte
	if _, err := f.ReadAt(sb[:], 1024); err != nil {
		return "", fmt.Errorf("image: %s: superblock: %w", path, err)
	}
	if sb[0x38] != 0x53 || sb[0x39] != 0xef {
		return "", fmt.Errorf("image: %s is not an ext2/3/4 image", path)
	}
	u := sb[0x68:0x78]
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}

// WritableDisk makes a guest's writable disk at path: an ext4 image of size bytes whose root
// holds the directories of hypervisor.WritableMounts (workspace/, tmp/, root/) with their
// modes, which the agent binds at /workspace, /tmp and /root.
func WritableDisk(ctx context.Context, path string, size int64) error {
	if size < 8*mib {
		return fmt.Errorf("image: writable disk size %d: must be at least 8 MiB", size)
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".writable-")
	if err != nil {
		return fmt.Errorf("image: writable disk: %w", err)
	}
	defer os.RemoveAll(dir)
	for _, w := range hypervisor.WritableMounts() {
		p := filepath.Join(dir, w.Subdir)
		if err := os.Mkdir(p, 0o700); err != nil {
			return fmt.Errorf("image: writable disk: %w", err)
		}
		mode := fs.FileMode(w.Mode & 0o777)
		if w.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		if err := os.Chmod(p, mode); err != nil {
			return fmt.Errorf("image: writable disk: %w", err)
		}
	}
	return mkfs(ctx, dir, path, "wb-writable", size)
}

// checkStatic refuses a dynamically linked ELF binary (one with an interpreter): the guest's
// root has no C library, so the kernel could not start it as init.
func checkStatic(path, what string) error {
	f, err := elf.Open(path)
	if err != nil {
		return nil // not ELF (a test's stand-in); the guest will say
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("image: %s %s is dynamically linked; the guest has no C library: build it with CGO_ENABLED=0 (make build)", what, path)
		}
	}
	return nil
}

func checkFile(path, what string) error {
	if path == "" {
		return fmt.Errorf("image: no %s given", what)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("image: %s %s: %w", what, path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("image: %s %s is not a regular file", what, path)
	}
	return nil
}

// fileSHA256 is the hex SHA-256 and the size of the file at path.
func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}
