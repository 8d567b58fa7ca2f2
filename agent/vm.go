package agent

import (
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The VM's layout, as `wb image build` and the cloudhv driver make it.
const (
	// VMWritableDisk is the writable disk's device: the VM's second virtio disk.
	VMWritableDisk = "/dev/vdb"
	// VMWritableDir is where the agent mounts the writable disk (a directory of the read-only
	// root filesystem, which the image builder creates); its workspace/, tmp/ and root/ are
	// then bound at /workspace, /tmp and /root.
	VMWritableDir = "/run/wb-writable"
	// VMHostname is the VM's hostname, as the OCI driver's guests have it.
	VMHostname = "wb-guest"
)

// vmWritableMount is one directory of the writable disk bound into the guest. The list
// mirrors hypervisor.WritableMounts (which the agent, importing nothing of wb's but
// wb/session, cannot import; a test checks they agree), with the OCI driver's options:
// /tmp and /root are noexec, /workspace is not.
type vmWritableMount struct {
	Subdir, Target string
	Mode           fs.FileMode
	NoExec         bool
}

func vmWritableMounts() []vmWritableMount {
	return []vmWritableMount{
		{Subdir: "workspace", Target: "/workspace", Mode: 0o755},
		{Subdir: "tmp", Target: "/tmp", Mode: 0o777 | fs.ModeSticky, NoExec: true},
		{Subdir: "root", Target: "/root", Mode: 0o700, NoExec: true},
	}
}

// vmMount is one mount(2) call.
type vmMount struct {
	Source, Target, FSType string
	Flags                  uintptr
	Data                   string
}

// vmHost is what setupVM looks at and acts on: the real system (realVMHost) or a test's fake.
// Paths are the guest's absolute paths.
type vmHost interface {
	MountPoint(path string) bool // path exists and is the root of a mount
	Exists(path string) bool
	Mkdir(path string, mode fs.FileMode) error // mkdir -p, then the mode of the last element
	Mount(m vmMount) error
	// Bind bind-mounts source at target, then remounts it with flags (MS_NOSUID, ...).
	Bind(source, target string, flags uintptr) error
	Hostname() string
	SetHostname(name string) error
	LinkUp(name string) (bool, error)
	SetLinkUp(name string) error
}

// setupVM does, as a VM's init, what a container runtime does for a container: each step is
// taken only when what it makes is missing, and a step that fails is logged and skipped (a
// guest under the test VMM is a runc container, where /proc and the rest already exist and
// there is no writable disk). disk is the writable disk's device (VMWritableDisk). It returns
// the steps it took, for the log and for tests.
func setupVM(log *slog.Logger, h vmHost, disk string) []string {
	var done []string
	step := func(what string, err error) bool {
		if err != nil {
			log.Warn("vm setup: step failed; going on without it", "step", what, "err", err)
			return false
		}
		log.Info("vm setup", "step", what)
		done = append(done, what)
		return true
	}
	const (
		nosuid = unix.MS_NOSUID
		nodev  = unix.MS_NODEV
		noexec = unix.MS_NOEXEC
	)
	// Parents before children: /sys/fs/cgroup exists only once sysfs is mounted.
	for _, m := range []vmMount{
		{Source: "proc", Target: "/proc", FSType: "proc", Flags: nosuid | nodev | noexec},
		{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: nosuid | nodev | noexec},
		{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: nosuid, Data: "mode=0755"},
		{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: nosuid | noexec, Data: "ptmxmode=0666,mode=0620,gid=5"},
		{Source: "shm", Target: "/dev/shm", FSType: "tmpfs", Flags: nosuid | nodev | noexec, Data: "mode=1777"},
		{Source: "cgroup2", Target: "/sys/fs/cgroup", FSType: "cgroup2", Flags: nosuid | nodev | noexec},
	} {
		if h.MountPoint(m.Target) {
			continue
		}
		if !h.Exists(m.Target) {
			if err := h.Mkdir(m.Target, 0o755); err != nil {
				step("mount "+m.FSType+" at "+m.Target, err)
				continue
			}
		}
		step("mount "+m.FSType+" at "+m.Target, h.Mount(m))
	}

	if writableDisk(log, h, disk, step) {
		for _, w := range vmWritableMounts() {
			src := filepath.Join(VMWritableDir, w.Subdir)
			if h.MountPoint(w.Target) {
				continue
			}
			if !h.Exists(src) {
				if err := h.Mkdir(src, w.Mode); err != nil {
					step("bind "+src+" at "+w.Target, err)
					continue
				}
			}
			flags := uintptr(nosuid | nodev)
			if w.NoExec {
				flags |= noexec
			}
			step("bind "+src+" at "+w.Target, h.Bind(src, w.Target, flags))
		}
	}

	if h.Hostname() != VMHostname {
		step("hostname "+VMHostname, h.SetHostname(VMHostname))
	}
	if up, err := h.LinkUp("lo"); err != nil || !up {
		step("bring up lo", h.SetLinkUp("lo"))
	}
	return done
}

// writableDisk mounts the writable disk at VMWritableDir unless it is mounted already, and
// reports whether it is mounted.
func writableDisk(log *slog.Logger, h vmHost, disk string, step func(string, error) bool) bool {
	if h.MountPoint(VMWritableDir) {
		return true
	}
	if !h.Exists(disk) {
		log.Info("vm setup: no writable disk; /workspace, /tmp and /root stay as they are", "disk", disk)
		return false
	}
	what := "mount " + disk + " at " + VMWritableDir
	if !h.Exists(VMWritableDir) {
		if err := h.Mkdir(VMWritableDir, 0o755); err != nil {
			return step(what, fmt.Errorf("%w (the image builder creates %s in the root filesystem)", err, VMWritableDir))
		}
	}
	return step(what, h.Mount(vmMount{Source: disk, Target: VMWritableDir, FSType: "ext4", Flags: unix.MS_NOSUID | unix.MS_NODEV}))
}

// realVMHost acts on the system, with every guest path below root ("/" in a VM; a test's
// directory in a mount namespace of its own otherwise).
type realVMHost struct{ root string }

func (h realVMHost) path(p string) string { return filepath.Join(h.root, p) }

// MountPoint asks statx whether path is a mount's root (Linux 5.8+, which sees bind mounts
// too); where the kernel does not say, a device that differs from the parent's means one.
func (h realVMHost) MountPoint(p string) bool {
	full := h.path(p)
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, full, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &st); err != nil {
		return false
	}
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	}
	var parent unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, filepath.Dir(full), 0, unix.STATX_BASIC_STATS, &parent); err != nil {
		return false
	}
	return st.Dev_major != parent.Dev_major || st.Dev_minor != parent.Dev_minor
}

func (h realVMHost) Exists(p string) bool {
	_, err := os.Lstat(h.path(p))
	return err == nil
}

func (h realVMHost) Mkdir(p string, mode fs.FileMode) error {
	if err := os.MkdirAll(h.path(p), 0o755); err != nil {
		return err
	}
	return os.Chmod(h.path(p), mode)
}

func (h realVMHost) Mount(m vmMount) error {
	src := m.Source
	if strings.HasPrefix(src, "/") { // a device; a pseudo filesystem's source is a name
		src = h.path(src)
	}
	if err := unix.Mount(src, h.path(m.Target), m.FSType, m.Flags, m.Data); err != nil {
		return fmt.Errorf("mount %s (%s) at %s: %w", m.Source, m.FSType, m.Target, err)
	}
	return nil
}

func (h realVMHost) Bind(source, target string, flags uintptr) error {
	if err := unix.Mount(h.path(source), h.path(target), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", source, target, err)
	}
	// A bind mount ignores other flags: they take a remount.
	if err := unix.Mount("", h.path(target), "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		return fmt.Errorf("remount %s with its options: %w", target, err)
	}
	return nil
}

func (h realVMHost) Hostname() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Nodename[:])
}

func (h realVMHost) SetHostname(name string) error { return unix.Sethostname([]byte(name)) }

func (h realVMHost) LinkUp(name string) (bool, error) {
	flags, err := linkFlags(name, nil)
	return flags&unix.IFF_UP != 0, err
}

func (h realVMHost) SetLinkUp(name string) error {
	_, err := linkFlags(name, func(f uint16) uint16 { return f | unix.IFF_UP })
	return err
}

// linkFlags reads interface name's flags and, with set, writes set(flags). (The kernel gives
// lo 127.0.0.1/8 and ::1 itself when it goes up.)
func linkFlags(name string, set func(uint16) uint16) (uint16, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("link %s: %w", name, err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, fmt.Errorf("link %s: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return 0, fmt.Errorf("link %s: get flags: %w", name, err)
	}
	flags := ifr.Uint16()
	if set == nil {
		return flags, nil
	}
	ifr.SetUint16(set(flags))
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return 0, fmt.Errorf("link %s: set flags: %w", name, err)
	}
	return set(flags), nil
}
