package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"wb/hypervisor"
)

// diskImage is the file that backs a guest's writable layer when it has a disk limit.
func diskImage(s hypervisor.Spec) string { return filepath.Clean(s.Writable) + ".img" }

// attachDisk puts the guest's writable layer on an ext4 file system of DiskGiB (a sparse
// image on a loop device), so that the guest's disk use stops at its allowance with ENOSPC.
// It is idempotent. When the image cannot be made or mounted the guest does not start, unless
// the operator allowed unlimited disks (then the layer stays a plain directory, said once in
// the log).
func (d *Driver) attachDisk(ctx context.Context, s hypervisor.Spec) error {
	if s.DiskGiB <= 0 {
		return os.MkdirAll(s.Writable, 0o755)
	}
	if err := os.MkdirAll(s.Writable, 0o755); err != nil {
		return fmt.Errorf("oci: writable layer: %w", err)
	}
	if mounted(s.Writable) {
		return nil
	}
	img := diskImage(s)
	run := func(name string, args ...string) error {
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %w: %s", name, err, out)
		}
		return nil
	}
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		f, err := os.OpenFile(img, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("oci: disk image: %w", err)
		}
		err = f.Truncate(int64(s.DiskGiB) << 30)
		f.Close()
		if err == nil {
			err = run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1", img)
		}
		if err != nil {
			os.Remove(img)
			return d.noDisk(s, err)
		}
	}
	if err := run("mount", "-o", "loop,nodev,nosuid", img, s.Writable); err != nil {
		// mount killed by ctx after the kernel had mounted (a node stopping mid-boot) failed
		// all the same: undo it, since without the guest's record nothing else knows to, and
		// the guest's directory would keep a mount and a loop device that no one owns.
		if mounted(s.Writable) {
			_ = syscall.Unmount(s.Writable, syscall.MNT_DETACH)
		}
		return d.noDisk(s, err)
	}
	// An empty layer, as a plain directory would be (a restore unpacks into it).
	_ = os.Remove(filepath.Join(s.Writable, "lost+found"))
	return nil
}

func (d *Driver) noDisk(s hypervisor.Spec, err error) error {
	os.Remove(diskImage(s))
	if !d.unlimitedDisk {
		return fmt.Errorf("oci: guest %s: cannot enforce its %d GiB disk limit (ext4 loop image): %w; "+
			"fix loop devices and mkfs.ext4 on this host, or start wb with --allow-unlimited-disk to run guests without a disk limit",
			s.ID, s.DiskGiB, err)
	}
	d.diskOnce.Do(func() {
		d.log.Warn("guest disk limits are off (--allow-unlimited-disk): this host cannot mount loop devices", "err", err)
	})
	return nil
}

// detachDisk unmounts and removes the guest's disk image, if it has one.
func detachDisk(s hypervisor.Spec) error {
	if s.Writable == "" {
		return nil
	}
	if mounted(s.Writable) {
		if err := syscall.Unmount(s.Writable, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("oci: unmount the writable layer: %w", err)
		}
	}
	if err := os.Remove(diskImage(s)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("oci: remove the disk image: %w", err)
	}
	return nil
}

// mounted reports whether dir is a mount point (its device differs from its parent's).
func mounted(dir string) bool {
	var a, b syscall.Stat_t
	if syscall.Stat(dir, &a) != nil || syscall.Stat(filepath.Dir(filepath.Clean(dir)), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}
