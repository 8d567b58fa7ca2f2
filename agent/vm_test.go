package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"wb/hypervisor"
)

// fakeVMHost is a guest's system as setupVM sees it: what exists, what is mounted, and which
// calls fail. It records the calls that change something.
type fakeVMHost struct {
	exists, mounted map[string]bool
	fail            map[string]error // by the call's record, e.g. "mount proc /proc"
	diskDevice      string           // appears when devtmpfs is mounted
	hostname        string
	loUp            bool
	calls           []string
}

func newFakeVMHost(exists ...string) *fakeVMHost {
	f := &fakeVMHost{exists: map[string]bool{"/": true}, mounted: map[string]bool{"/": true}, fail: map[string]error{}, hostname: "(none)"}
	for _, p := range exists {
		f.exists[p] = true
	}
	return f
}

func (f *fakeVMHost) do(call string) error {
	if err := f.fail[call]; err != nil {
		return err
	}
	f.calls = append(f.calls, call)
	return nil
}

func (f *fakeVMHost) MountPoint(p string) bool { return f.mounted[p] }
func (f *fakeVMHost) Exists(p string) bool     { return f.exists[p] }

func (f *fakeVMHost) Mkdir(p string, mode fs.FileMode) error {
	if err := f.do(fmt.Sprintf("mkdir %s %v", p, mode)); err != nil {
		return err
	}
	f.exists[p] = true
	return nil
}

func (f *fakeVMHost) Mount(m vmMount) error {
	if err := f.do(fmt.Sprintf("mount %s %s", m.FSType, m.Target)); err != nil {
		return err
	}
	f.mounted[m.Target] = true
	switch m.FSType {
	case "sysfs":
		f.exists["/sys/fs/cgroup"] = true
	case "devtmpfs":
		if f.diskDevice != "" {
			f.exists[f.diskDevice] = true
		}
	}
	return nil
}

func (f *fakeVMHost) Bind(source, target string, flags uintptr) error {
	var opts []string
	for _, o := range []struct {
		flag uintptr
		name string
	}{{unix.MS_NOSUID, "nosuid"}, {unix.MS_NODEV, "nodev"}, {unix.MS_NOEXEC, "noexec"}} {
		if flags&o.flag != 0 {
			opts = append(opts, o.name)
		}
	}
	if err := f.do(fmt.Sprintf("bind %s %s %s", source, target, strings.Join(opts, ","))); err != nil {
		return err
	}
	f.mounted[target] = true
	return nil
}

func (f *fakeVMHost) Hostname() string { return f.hostname }

func (f *fakeVMHost) SetHostname(name string) error {
	if err := f.do("hostname " + name); err != nil {
		return err
	}
	f.hostname = name
	return nil
}

func (f *fakeVMHost) LinkUp(name string) (bool, error) { return name == "lo" && f.loUp, nil }

func (f *fakeVMHost) SetLinkUp(name string) error {
	if err := f.do("up " + name); err != nil {
		return err
	}
	f.loUp = true
	return nil
}

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// TestSetupVMDecisions: which steps the agent takes as a VM's init, given what exists.
func TestSetupVMDecisions(t *testing.T) {
	t.Parallel()
	// A freshly booted VM: the image's directories on a read-only root, nothing mounted, the
	// writable disk's device appearing with devtmpfs, its subdirectories made by the driver.
	bootedVM := func() *fakeVMHost {
		f := newFakeVMHost("/proc", "/sys", "/dev", "/workspace", "/tmp", "/root", VMWritableDir)
		f.diskDevice = VMWritableDisk
		f.exists[VMWritableDir+"/workspace"] = true
		f.exists[VMWritableDir+"/tmp"] = true
		f.exists[VMWritableDir+"/root"] = true
		return f
	}
	fullSetup := []string{
		"mount proc /proc",
		"mount sysfs /sys",
		"mount devtmpfs /dev",
		"mkdir /dev/pts -rwxr-xr-x",
		"mount devpts /dev/pts",
		"mkdir /dev/shm -rwxr-xr-x",
		"mount tmpfs /dev/shm",
		"mount cgroup2 /sys/fs/cgroup",
		"mount ext4 " + VMWritableDir,
		"bind " + VMWritableDir + "/workspace /workspace nosuid,nodev",
		"bind " + VMWritableDir + "/tmp /tmp nosuid,nodev,noexec",
		"bind " + VMWritableDir + "/root /root nosuid,nodev,noexec",
		"hostname " + VMHostname,
		"up lo",
	}
	for _, c := range []struct {
		name  string
		host  func() *fakeVMHost
		calls []string
	}{
		{"booted VM: every step", bootedVM, fullSetup},
		{
			// Under the test VMM the guest is a runc container: its runtime made all of it.
			"runc guest: nothing to do", func() *fakeVMHost {
				f := newFakeVMHost("/proc", "/sys", "/dev", "/dev/pts", "/dev/shm", "/sys/fs/cgroup", "/workspace", "/tmp", "/root")
				for _, p := range []string{"/proc", "/sys", "/dev", "/dev/pts", "/dev/shm", "/sys/fs/cgroup", "/workspace", "/tmp", "/root"} {
					f.mounted[p] = true
				}
				f.hostname, f.loUp = VMHostname, true
				return f
			}, nil,
		},
		{
			"no writable disk: the rest still", func() *fakeVMHost {
				f := bootedVM()
				f.diskDevice = ""
				return f
			}, slices.DeleteFunc(slices.Clone(fullSetup), func(c string) bool {
				return strings.Contains(c, VMWritableDir)
			}),
		},
		{
			"a failing mount is skipped, the others still made", func() *fakeVMHost {
				f := bootedVM()
				f.fail["mount proc /proc"] = unix.EPERM
				f.fail["hostname "+VMHostname] = unix.EPERM
				return f
			}, slices.DeleteFunc(slices.Clone(fullSetup), func(c string) bool {
				return c == "mount proc /proc" || c == "hostname "+VMHostname
			}),
		},
		{
			"the disk does not mount: no binds onto the root filesystem", func() *fakeVMHost {
				f := bootedVM()
				f.fail["mount ext4 "+VMWritableDir] = unix.EINVAL
				return f
			}, slices.DeleteFunc(slices.Clone(fullSetup), func(c string) bool {
				return strings.Contains(c, VMWritableDir)
			}),
		},
		{
			"a disk without root/: made with its mode", func() *fakeVMHost {
				f := bootedVM()
				delete(f.exists, VMWritableDir+"/root")
				return f
			}, slices.Insert(slices.Clone(fullSetup), 11, "mkdir "+VMWritableDir+"/root -rwx------"),
		},
		{
			"an image without the disk's mount point (a read-only root): no binds", func() *fakeVMHost {
				f := bootedVM()
				delete(f.exists, VMWritableDir)
				f.fail[fmt.Sprintf("mkdir %s %v", VMWritableDir, fs.FileMode(0o755))] = unix.EROFS
				return f
			}, slices.DeleteFunc(slices.Clone(fullSetup), func(c string) bool {
				return strings.Contains(c, VMWritableDir)
			}),
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := c.host()
			setupVM(testLogger(), f, VMWritableDisk)
			if !slices.Equal(f.calls, c.calls) {
				t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(f.calls, "\n  "), strings.Join(c.calls, "\n  "))
			}
			// A second run on the same system (e.g. a restarted agent) changes nothing: what
			// was made is found, what failed fails again.
			f.calls = nil
			if setupVM(testLogger(), f, VMWritableDisk); len(f.calls) > 0 {
				t.Errorf("second run changed: %v", f.calls)
			}
		})
	}
}

// TestVMWritableMountsAgree: the agent binds what the drivers put in the writable layer.
func TestVMWritableMountsAgree(t *testing.T) {
	t.Parallel()
	want := hypervisor.WritableMounts()
	got := vmWritableMounts()
	if len(got) != len(want) {
		t.Fatalf("agent binds %d writable dirs, hypervisor.WritableMounts has %d", len(got), len(want))
	}
	for i := range want {
		mode := uint32(got[i].Mode.Perm())
		if got[i].Mode&fs.ModeSticky != 0 {
			mode |= 0o1000
		}
		if got[i].Subdir != want[i].Subdir || got[i].Target != want[i].Target || mode != want[i].Mode {
			t.Errorf("writable mount %d: agent %+v, hypervisor %+v", i, got[i], want[i])
		}
	}
}

// vmSetupChildEnv carries the root directory to the re-executed test binary that runs
// setupVM for real in namespaces of its own.
const vmSetupChildEnv = "WB_TEST_VMSETUP_ROOT"

// TestSetupVMInNamespaces runs the real setup in a child in new mount, UTS and network
// namespaces, on a directory standing for the VM's root and a loop device standing for its
// writable disk: every mount is made, the disk's directories are bound with their options,
// the hostname is set and lo comes up; a second run takes no step.
func TestSetupVMInNamespaces(t *testing.T) {
	if root := os.Getenv(vmSetupChildEnv); root != "" {
		vmSetupChild(t, root, os.Getenv(vmSetupChildEnv+"_DISK"))
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts, namespaces, a loop device)")
	}
	for _, tool := range []string{"mkfs.ext4", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	for _, d := range []string{"proc", "sys", "dev", "workspace", "tmp", "root", VMWritableDir} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The writable disk as the driver makes it, with a file to find at /workspace.
	content := filepath.Join(dir, "writable")
	for _, d := range []string{"workspace", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(content, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(content, "workspace", "marker"), []byte("from the disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "writable.ext4")
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-d", content, img, "8M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", img).Output()
	if err != nil {
		t.Skipf("no loop device: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSetupVMInNamespaces$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), vmSetupChildEnv+"="+root, vmSetupChildEnv+"_DISK="+loop)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWNET}
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("setup in namespaces: %v\n%s", err, out)
	}
	if testing.Verbose() {
		t.Logf("child:\n%s", out)
	}
}

// vmSetupChild runs in the re-executed test binary, in its own namespaces.
func vmSetupChild(t *testing.T, root, disk string) {
	// Nothing mounted here may reach the parent's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make / private: %v", err)
	}
	h := realVMHost{root: root}
	steps := setupVM(testLogger(), h, disk)
	b, _ := json.Marshal(steps)
	t.Logf("steps: %s", b)
	for _, want := range []string{
		"mount proc at /proc", "mount sysfs at /sys", "mount devtmpfs at /dev", "mount devpts at /dev/pts",
		"mount tmpfs at /dev/shm", "mount cgroup2 at /sys/fs/cgroup", "mount " + disk + " at " + VMWritableDir,
		"bind " + VMWritableDir + "/workspace at /workspace", "bind " + VMWritableDir + "/tmp at /tmp",
		"bind " + VMWritableDir + "/root at /root", "hostname " + VMHostname, "bring up lo",
	} {
		if !slices.Contains(steps, want) {
			t.Errorf("step %q not taken", want)
		}
	}
	at := func(p string) string { return filepath.Join(root, p) }
	for _, p := range []string{"/proc/self/status", "/sys/kernel", "/dev/null", "/dev/pts/ptmx", "/sys/fs/cgroup/cgroup.controllers"} {
		if _, err := os.Stat(at(p)); err != nil {
			t.Errorf("%s after setup: %v", p, err)
		}
	}
	if b, err := os.ReadFile(at("/workspace/marker")); err != nil || string(b) != "from the disk" {
		t.Errorf("/workspace/marker = %q, %v; want the writable disk's file", b, err)
	}
	for _, c := range []struct {
		path   string
		noexec bool
	}{{"/workspace", false}, {"/tmp", true}, {"/root", true}} {
		var st unix.Statfs_t
		if err := unix.Statfs(at(c.path), &st); err != nil {
			t.Fatal(err)
		}
		if st.Type != unix.EXT4_SUPER_MAGIC {
			t.Errorf("%s is on filesystem %#x, want ext4 (the writable disk)", c.path, st.Type)
		}
		if got := st.Flags&unix.ST_NOEXEC != 0; got != c.noexec {
			t.Errorf("%s noexec = %v, want %v", c.path, got, c.noexec)
		}
		if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
			t.Errorf("%s lacks nosuid or nodev (flags %#x)", c.path, st.Flags)
		}
	}
	if got := h.Hostname(); got != VMHostname {
		t.Errorf("hostname = %q, want %q", got, VMHostname)
	}
	// lo is up: a loopback listener answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on lo: %v", err)
	}
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Errorf("dial lo: %v", err)
	} else {
		c.Close()
	}
	ln.Close()

	if again := setupVM(testLogger(), h, disk); len(again) > 0 {
		t.Errorf("a second setup took steps: %v", again)
	}
}
