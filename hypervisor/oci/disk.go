package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"wb/hypervisor"
)

// diskImage is the file that backs a guest's writable layer when it has a disk limit.
func diskImage(s hypervisor.Spec) string { return filepath.Clean(s.Writable) + ".img" }

// diskTemplates is the default dir, in the bundle root, of the empty file systems that
// guests' disk images are copied from (not a valid guest id, so never taken for a bundle).
const diskTemplates = "_disks"

// newDiskImage writes img, an empty ext4 file system of gib GiB: a sparse copy of the
// driver's template of that size, which it formats once (mkfs.ext4 at every guest's start
// was about 10 ms of CPU, a warm pool's refill pays it per run, and the copy is 0.15 MB of
// metadata). Where the copy cannot be made, img is formatted itself.
//
// The copies share the template's UUID and directory hash seed: ext4 does not need them
// unique, and each guest's file system is its own (a seed known to a guest lets it make its
// own directories slow, which its CPU limit bounds anyway).
func (d *Driver) newDiskImage(ctx context.Context, img string, gib int) error {
	tpl, err := d.diskTemplate(ctx, gib)
	if err == nil {
		if err = copySparse(tpl, img, int64(gib)<<30); err == nil {
			return nil
		}
		os.Remove(img)
	}
	d.log.Warn("guest disk: no template copy; formatting the image itself", "err", err)
	return mkfsImage(ctx, img, gib)
}

// diskTemplate answers the path of the driver's empty file system of gib GiB, formatting it
// first if need be. Its name carries the format's options: a change of them makes new ones.
func (d *Driver) diskTemplate(ctx context.Context, gib int) (string, error) {
	d.diskMu.Lock()
	defer d.diskMu.Unlock()
	dir := d.diskTemplates
	owner := 0
	if d.userNS() {
		owner = guestRootID
	}
	path := filepath.Join(dir, fmt.Sprintf("%s%dg-u%d.img", diskTemplateVersion, gib, owner))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("oci: disk templates: %w", err)
	}
	tmp := path + ".tmp"
	if err := mkfsImage(ctx, tmp, gib); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := d.layoutTemplate(tmp); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("oci: disk template: %w", err)
	}
	d.removeOldTemplates(dir)
	return path, nil
}

// diskTemplateVersion begins the name of each disk template of this format and layout; a
// change of either changes it, so that no node reuses another version's template.
const diskTemplateVersion = "ext4-v3-"

// removeOldTemplates removes from dir the templates of other versions (an earlier node's,
// left by an upgrade): no guest uses a template once its copy is made, and a node of that
// version makes its own again. Failing, they are only left, as before.
func (d *Driver) removeOldTemplates(dir string) {
	old, _ := filepath.Glob(filepath.Join(dir, "ext4-v*.img"))
	for _, p := range old {
		if strings.HasPrefix(filepath.Base(p), diskTemplateVersion) {
			continue
		}
		if err := os.Remove(p); err != nil {
			d.log.Warn("guest disk: an old template is left", "path", p, "err", err)
		}
	}
}

// layoutTemplate makes in img, an empty file system, the dirs of every guest's writable layer
// (layoutWritable) and removes its lost+found, so that each guest's copy has them already:
// made in each guest's new file system, whose every inode allocation (ext4 without a journal)
// is checked against recent deletions, they were about 1.5 ms of CPU a guest. prepare still
// makes sure of them (an image formatted itself has none).
func (d *Driver) layoutTemplate(img string) error {
	mnt := img + ".mnt"
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("oci: disk template: %w", err)
	}
	defer os.Remove(mnt)
	if err := mountLoop(img, mnt); err != nil {
		return err
	}
	err := d.layoutWritable(mnt)
	if rerr := os.Remove(filepath.Join(mnt, "lost+found")); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("oci: disk template: %w", rerr))
	}
	// Not detached: the unmount writes the file system back to img before it is copied.
	if uerr := unix.Unmount(mnt, 0); uerr != nil {
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
		return errors.Join(err, fmt.Errorf("oci: disk template: unmount: %w", uerr))
	}
	return err
}

// mkfsImage creates img, a sparse file of gib GiB, and formats it ext4: no journal (a guest's
// disk does not outlive a crash of its host), no reserved blocks, and no room kept for growing
// online (resize_inode: a guest's disk never grows while mounted, and the room was 0.45 MB of
// the 0.6 MB that each copy of a template wrote). Its inode tables are zeroed now (as holes),
// so that the kernel does not zero them in the background after each mount (lazy_itable_init).
func mkfsImage(ctx context.Context, img string, gib int) error {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("oci: disk image: %w", err)
	}
	err = f.Truncate(int64(gib) << 30)
	f.Close()
	if err != nil {
		return fmt.Errorf("oci: disk image: %w", err)
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=0", img).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, out)
	}
	return nil
}

// copySparse copies src's data to a new file dst of size bytes, leaving src's holes holes.
func copySparse(src, dst string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("oci: disk template: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("oci: disk image: %w", err)
	}
	defer out.Close()
	if err := out.Truncate(size); err != nil {
		return fmt.Errorf("oci: disk image: %w", err)
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("oci: disk template: seek data: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("oci: disk template: seek hole: %w", err)
		}
		for from := data; from < hole; {
			r, w := from, from
			n, err := unix.CopyFileRange(int(in.Fd()), &r, int(out.Fd()), &w, int(hole-from), 0)
			if err != nil {
				return fmt.Errorf("oci: disk image: copy: %w", err)
			}
			if n == 0 {
				return fmt.Errorf("oci: disk image: copy: the template ended at %d of %d bytes", from, size)
			}
			from += int64(n)
		}
		off = hole
	}
	return nil
}

// mountLoop attaches img to a free loop device that frees itself once unused (autoclear) and
// mounts its ext4 file system on dir, nodev and nosuid: what `mount -o loop,nodev,nosuid`
// does, without starting it (about 5 ms of CPU a guest). A mount that fails leaves neither a
// mount nor an attached device.
func mountLoop(img, dir string) error {
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("oci: disk image: %w", err)
	}
	defer f.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("oci: loop devices: %w", err)
	}
	defer ctl.Close()
	// Another process can take the free device between the two calls: then ask again.
	for range 32 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("oci: no free loop device: %w", err)
		}
		dev, err := openLoop(n)
		if err != nil {
			return err
		}
		err = attachLoop(dev, f)
		if errors.Is(err, unix.EBUSY) {
			dev.Close()
			continue
		}
		if err != nil {
			dev.Close()
			return fmt.Errorf("oci: attach %s to %s: %w", img, dev.Name(), err)
		}
		err = unix.Mount(dev.Name(), dir, "ext4", unix.MS_NODEV|unix.MS_NOSUID, "")
		dev.Close() // the mount holds the device now; without one, autoclear frees it here
		if err != nil {
			return fmt.Errorf("oci: mount %s (%s) on %s: %w", dev.Name(), img, dir, err)
		}
		return nil
	}
	return errors.New("oci: every free loop device was taken by another process before this one")
}

// openLoop opens /dev/loopN, making its node where the host's /dev has none yet (no devtmpfs).
func openLoop(n int) (*os.File, error) {
	path := fmt.Sprintf("/dev/loop%d", n)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("oci: make %s: %w", path, err)
		}
		f, err = os.OpenFile(path, os.O_RDWR, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("oci: loop device: %w", err)
	}
	return f, nil
}

// attachLoop backs loop device dev with file f, autoclear: LOOP_CONFIGURE (Linux 5.8), else
// LOOP_SET_FD and LOOP_SET_STATUS64.
func attachLoop(dev, f *os.File) error {
	cfg := unix.LoopConfig{Fd: uint32(f.Fd()), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}}
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], f.Name()) // for losetup -l
	err := unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return err
	}
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_FD, int(f.Fd())); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(int(dev.Fd()), &cfg.Info); err != nil {
		_ = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

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
	fresh := false
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		if err := d.newDiskImage(ctx, img, s.DiskGiB); err != nil {
			os.Remove(img)
			return d.noDisk(s, err)
		}
		fresh = true
	}
	if err := mountLoop(img, s.Writable); err != nil {
		return d.noDisk(s, err)
	}
	// An empty layer, as a plain directory would be (a restore unpacks into it): but for the
	// dirs every layer has (a template's copy has them, see layoutTemplate), dated now, as
	// made for this guest.
	_ = os.Remove(filepath.Join(s.Writable, "lost+found"))
	if fresh {
		now := time.Now()
		for _, w := range hypervisor.WritableMounts() {
			_ = os.Chtimes(filepath.Join(s.Writable, w.Subdir), now, now)
		}
		_ = os.Chtimes(s.Writable, now, now)
	}
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
