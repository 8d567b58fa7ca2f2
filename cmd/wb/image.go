//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"wb/hypervisor/cloudhv/image"
)

const imageUsage = `Usage: wb image build --out DIR [flags]

Assembles a Cloud Hypervisor guest image from Debian packages into DIR:
  vmlinuz        the kernel of linux-image-cloud-amd64 (downloaded with apt-get download and
                 cached), or the one given with --kernel-deb or --kernel
  initramfs.img  busybox and the kernel's virtio/vsock modules; it mounts the rootfs and runs
                 wb as init (not made for --kernel, which must have those drivers built in)
  rootfs.ext4    a busybox root filesystem with this wb binary at /run/wb-bin/wb as init
                 (also /sbin/init), made with mkfs.ext4 -d
  manifest.json  each file's path, size and sha256, the kernel package and version, and
                 the kernel command line to boot with
Needs apt-get and dpkg-deb (for the kernel), mkfs.ext4 and busybox-static.

Flags:
`

// imageCmd is `wb image`.
func imageCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, "Usage: wb image build --out DIR [flags]\n\nCommands:\n  build   assemble a Cloud Hypervisor guest image (kernel, initramfs, ext4 rootfs, manifest)\n\nRun \"wb image build --help\" for its flags.\n")
		if len(args) == 0 {
			return errors.New("wb image: no command given (want build)")
		}
		return nil
	}
	if args[0] != "build" {
		return fmt.Errorf("wb image: unknown command %q (want build)", args[0])
	}
	fs := flag.NewFlagSet("wb image build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o image.Options
	self, _ := os.Executable()
	cacheDefault := ""
	if c, err := os.UserCacheDir(); err == nil {
		cacheDefault = filepath.Join(c, "wb", "kernel-debs")
	}
	var size string
	fs.StringVar(&o.Out, "out", "", "`dir`ectory to write the image to (created; required)")
	fs.StringVar(&o.WB, "wb", self, "static wb `binary` to install as the guest's init (built with CGO_ENABLED=0; default: this one)")
	fs.StringVar(&o.KernelDeb, "kernel-deb", "", "linux-image `.deb` to take the kernel and its modules from instead of downloading linux-image-cloud-amd64's")
	fs.StringVar(&o.Kernel, "kernel", "", "bzImage `path` to use as it is, with no initramfs: it must have virtio PCI, block, console and vsock built in")
	fs.StringVar(&o.CacheDir, "cache-dir", cacheDefault, "`dir`ectory keeping downloaded kernel packages")
	fs.StringVar(&size, "size", "", "rootfs disk `size` in bytes, or with a K, M or G suffix (e.g. 512M); default: its content plus headroom")
	fs.StringVar(&o.Busybox, "busybox", "", "static busybox `binary` (default /bin/busybox)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), imageUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("wb image build takes no arguments, got %q", fs.Args())
	}
	if o.Out == "" {
		return errors.New("wb image build: --out is required (the directory to write the image to)")
	}
	var err error
	if o.Size, err = parseSize(size); err != nil {
		return fmt.Errorf("wb image build: --size: %w", err)
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	m, err := image.Build(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\nkernel %s %s\nrootfs %s (%d MiB)\ncmdline %s\n",
		filepath.Join(o.Out, image.ManifestFile), m.KernelPackage, m.KernelVersion, m.RootFS.Path, m.RootFS.Size>>20, m.Cmdline)
	return nil
}

// parseSize reads "123", "64K", "512M" or "2G" (binary units); "" is 0.
func parseSize(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	mult := int64(1)
	switch strings.ToUpper(s[len(s)-1:]) {
	case "K":
		mult = 1 << 10
	case "M":
		mult = 1 << 20
	case "G":
		mult = 1 << 30
	}
	num := s
	if mult > 1 {
		num = s[:len(s)-1]
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("%q is not a size (e.g. 536870912, 512M, 2G)", s)
	}
	return n * mult, nil
}
