package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"wb/hypervisor"
)

// AgentVsockPort is the vsock port the guest's agent listens on.
const AgentVsockPort = 1024

// Cmdline is the kernel command line a guest of the image boots with: the console, the
// read-only root disk, wb as init, and init's arguments after "--" (`wb agent --vsock-port`).
// A driver adds the agent's environment as KEY=VALUE words before " -- ".
const Cmdline = "console=hvc0 root=/dev/vda ro init=" + hypervisor.GuestAgentBin + " -- agent --vsock-port 1024"

// Output file names in Options.Out.
const (
	ManifestFile  = "manifest.json"
	KernelFile    = "vmlinuz"
	InitramfsFile = "initramfs.img"
	RootFSFile    = "rootfs.ext4"
)

// Options configures Build.
type Options struct {
	// Out is the directory the image is written to (created).
	Out string
	// WB is the static wb binary to install as the guest's init (required).
	WB string
	// Kernel is a bzImage to use as it is, with no initramfs: it must have virtio PCI, block,
	// console and vsock built in. Empty: take Debian's cloud kernel (KernelDeb, or downloaded).
	Kernel string
	// KernelDeb is a linux-image .deb to take the kernel and its modules from instead of
	// downloading the current linux-image-cloud-amd64's.
	KernelDeb string
	// CacheDir keeps downloaded kernel packages; default Out/cache.
	CacheDir string
	// Size is the rootfs disk's size in bytes (a multiple of 1 KiB); 0: its content plus
	// headroom.
	Size int64
	// Busybox is the static busybox binary; default /bin/busybox, else /usr/bin/busybox.
	Busybox string
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

// File is one file of an image.
type File struct {
	Path   string `json:"path"` // relative to the manifest's directory
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Manifest describes a built image (manifest.json).
type Manifest struct {
	Kernel File `json:"kernel"`
	// KernelPackage and KernelVersion name the Debian package the kernel came from (empty for
	// Options.Kernel).
	KernelPackage string `json:"kernel_package,omitempty"`
	KernelVersion string `json:"kernel_version,omitempty"`
	// Initramfs loads Modules (in this order) before switching to the rootfs; absent for a
	// kernel given as Options.Kernel. The VM's payload.initramfs.
	Initramfs *File    `json:"initramfs,omitempty"`
	Modules   []string `json:"modules,omitempty"`
	// RootFS is the read-only root disk (raw ext4).
	RootFS File `json:"rootfs"`
	// WB is the binary installed at /run/wb-bin/wb in RootFS (its path is the input's).
	WB      File      `json:"wb"`
	Cmdline string    `json:"cmdline"`
	Built   time.Time `json:"built"`
}

// Build assembles a guest image in o.Out and returns its manifest (also written to
// Out/manifest.json).
func Build(ctx context.Context, o Options) (Manifest, error) {
	var m Manifest
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.Out == "" {
		return m, errors.New("image: no output directory given (--out)")
	}
	if err := checkFile(o.WB, "wb binary (--wb)"); err != nil {
		return m, err
	}
	if err := checkStatic(o.WB, "wb binary (--wb)"); err != nil {
		return m, err
	}
	if o.Kernel != "" && o.KernelDeb != "" {
		return m, errors.New("image: --kernel and --kernel-deb exclude each other")
	}
	if o.Kernel != "" {
		if err := checkFile(o.Kernel, "kernel (--kernel)"); err != nil {
			return m, err
		}
	}
	if o.KernelDeb != "" {
		if err := checkFile(o.KernelDeb, "kernel package (--kernel-deb)"); err != nil {
			return m, err
		}
	}
	if o.Size < 0 || o.Size%1024 != 0 {
		return m, fmt.Errorf("image: --size %d: must be a positive multiple of 1 KiB, or 0 for automatic", o.Size)
	}
	busybox, err := findBusybox(o.Busybox)
	if err != nil {
		return m, err
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return m, fmt.Errorf("image: --out: %w", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return m, fmt.Errorf("image: --out: %w", err)
	}
	scratch, err := os.MkdirTemp(out, ".build-")
	if err != nil {
		return m, fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(scratch)

	// The kernel, and the initramfs with its modules.
	if o.Kernel != "" {
		if err := copyFile(o.Kernel, filepath.Join(scratch, KernelFile), 0o644); err != nil {
			return m, fmt.Errorf("image: kernel: %w", err)
		}
		log.Warn("image: a kernel given with --kernel boots without an initramfs: it needs virtio PCI, block, console and vsock built in")
	} else {
		deb := o.KernelDeb
		if deb == "" {
			cache := o.CacheDir
			if cache == "" {
				cache = filepath.Join(out, "cache")
			}
			log.Info("image: downloading the kernel package", "package", KernelMetaPackage, "cache", cache)
			if deb, err = downloadKernelDeb(ctx, log, cache); err != nil {
				return m, err
			}
		}
		k, err := unpackKernel(ctx, deb, filepath.Join(scratch, "kernel"))
		if err != nil {
			return m, err
		}
		m.KernelPackage, m.KernelVersion = k.pkg, k.version
		if err := copyFile(k.vmlinuz, filepath.Join(scratch, KernelFile), 0o644); err != nil {
			return m, fmt.Errorf("image: kernel: %w", err)
		}
		idx, err := moduleIndex(k.modules)
		if err != nil {
			return m, err
		}
		if m.Modules, err = moduleLoadOrder(idx, vmModules()); err != nil {
			return m, err
		}
		if err := writeInitramfs(filepath.Join(scratch, InitramfsFile), busybox, idx, m.Modules); err != nil {
			return m, err
		}
		_ = os.RemoveAll(filepath.Join(scratch, "kernel"))
		log.Info("image: kernel", "package", k.pkg, "version", k.version, "modules", len(m.Modules))
	}

	// The root filesystem.
	root := filepath.Join(scratch, "root")
	if err := busyboxRoot(ctx, root, busybox); err != nil {
		return m, err
	}
	if err := addAgent(root, o.WB); err != nil {
		return m, err
	}
	if err := mkfs(ctx, root, filepath.Join(scratch, RootFSFile), "wb-rootfs", o.Size); err != nil {
		return m, err
	}

	// Into place, and the manifest.
	names := []string{KernelFile, RootFSFile}
	if m.KernelPackage != "" {
		names = append(names, InitramfsFile)
	} else {
		_ = os.Remove(filepath.Join(out, InitramfsFile)) // a previous build's would not match
	}
	for _, n := range names {
		if err := os.Rename(filepath.Join(scratch, n), filepath.Join(out, n)); err != nil {
			return m, fmt.Errorf("image: %w", err)
		}
	}
	describe := func(path string) (File, error) {
		sum, size, err := fileSHA256(path)
		if err != nil {
			return File{}, fmt.Errorf("image: %w", err)
		}
		rel, err := filepath.Rel(out, path)
		if err != nil {
			rel = path
		}
		return File{Path: rel, SHA256: sum, Size: size}, nil
	}
	if m.Kernel, err = describe(filepath.Join(out, KernelFile)); err != nil {
		return m, err
	}
	if m.KernelPackage != "" {
		f, err := describe(filepath.Join(out, InitramfsFile))
		if err != nil {
			return m, err
		}
		m.Initramfs = &f
	}
	if m.RootFS, err = describe(filepath.Join(out, RootFSFile)); err != nil {
		return m, err
	}
	absWB, _ := filepath.Abs(o.WB)
	if m.WB, err = describe(absWB); err != nil {
		return m, err
	}
	m.WB.Path = absWB
	m.Cmdline = Cmdline
	m.Built = time.Now().UTC().Truncate(time.Second)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, fmt.Errorf("image: manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, ManifestFile), append(b, '\n'), 0o644); err != nil {
		return m, fmt.Errorf("image: manifest: %w", err)
	}
	log.Info("image: built", "dir", out, "rootfs_mib", m.RootFS.Size/mib)
	return m, nil
}

// ReadManifest reads dir/manifest.json, with its files' paths made absolute.
func ReadManifest(dir string) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return m, fmt.Errorf("image: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("image: %s: %w", filepath.Join(dir, ManifestFile), err)
	}
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	m.Kernel.Path, m.RootFS.Path = abs(m.Kernel.Path), abs(m.RootFS.Path)
	if m.Initramfs != nil {
		m.Initramfs.Path = abs(m.Initramfs.Path)
	}
	return m, nil
}

func findBusybox(given string) (string, error) {
	if given != "" {
		return given, checkFile(given, "busybox")
	}
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("image: no busybox (Debian: apt-get install busybox-static)")
}

// busyboxRoot lays out a minimal root at root: busybox and its applets in /bin, /usr/bin/env,
// the guest's directories and a minimal /etc (as tpl_base has them).
func busyboxRoot(ctx context.Context, root, busybox string) error {
	listing, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("image: %s --list: %w", busybox, err)
	}
	applets := strings.Fields(string(listing))
	if !slices.Contains(applets, "sh") {
		return fmt.Errorf("image: %s has no sh applet", busybox)
	}
	for _, d := range []string{"bin", "etc", "usr/bin", "var", "sbin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return fmt.Errorf("image: rootfs: %w", err)
		}
	}
	if err := copyFile(busybox, filepath.Join(root, "bin", "busybox"), 0o755); err != nil {
		return fmt.Errorf("image: busybox: %w", err)
	}
	for _, a := range applets {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("image: rootfs: %w", err)
		}
	}
	links := map[string]string{"usr/bin/env": "../../bin/busybox", "var/tmp": "../tmp"}
	for p, t := range links {
		if err := os.Symlink(t, filepath.Join(root, p)); err != nil {
			return fmt.Errorf("image: rootfs: %w", err)
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n",
		"etc/hosts":    "127.0.0.1\tlocalhost wb-guest\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"etc/hostname": "wb-guest\n",
		"etc/shells":   "/bin/sh\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			return fmt.Errorf("image: rootfs: %w", err)
		}
	}
	return nil
}
