package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"wb/agent"
	"wb/hypervisor"
	"wb/internal/proc"
	"wb/internal/syncbuf"
)

func TestDetectCgroups(t *testing.T) {
	dir := t.TempDir()
	mi := filepath.Join(dir, "mountinfo")
	const hybrid = `25 30 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
28 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
29 25 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
30 25 0:28 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,pids
31 25 0:29 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,xattr,name=systemd
`
	if err := os.WriteFile(mi, []byte(hybrid), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := detectCgroups(mi, filepath.Join(dir, "no-such", "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	if h.v2 || h.v1["cpuacct"] != "/sys/fs/cgroup/cpu,cpuacct" || h.v1["memory"] != "/sys/fs/cgroup/memory" || h.v1["pids"] != "/sys/fs/cgroup/pids" {
		t.Fatalf("hybrid layout detected as %+v", h)
	}
	if got := h.dirs("/wb/g1"); !slices.Contains(got, "/sys/fs/cgroup/memory/wb/g1") || !slices.Contains(got, "/sys/fs/cgroup/systemd/wb/g1") || !slices.Contains(got, "/sys/fs/cgroup/unified/wb/g1") || len(got) != 5 {
		t.Fatalf("dirs = %v", got)
	}

	// v2: the probe file exists; counters come from cpu.stat, memory.current, memory.events.
	root := filepath.Join(dir, "cg2")
	g := filepath.Join(root, "wb", "g1")
	if err := os.MkdirAll(g, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"cgroup.controllers":   "cpu memory pids\n",
		"wb/g1/cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\n",
		"wb/g1/memory.current": "1048576\n",
		"wb/g1/memory.events":  "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h, err = detectCgroups(mi, filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	if !h.v2 || h.v2Root != root {
		t.Fatalf("v2 layout detected as %+v", h)
	}
	st, err := h.read("/wb/g1")
	if err != nil {
		t.Fatal(err)
	}
	if st != (cgroupStats{cpuNanos: 2500000000, memoryBytes: 1048576, oomKills: 2}) {
		t.Fatalf("v2 stats = %+v", st)
	}
}

// TestThaw: thaw writes the freezer's thawed state in the guest's own cgroup (v1's
// freezer.state, v2's cgroup.freeze) and reports whether it reads so; with no freezer, or no
// cgroup, it reports false (the driver then asks the runtime).
func TestThaw(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	read := func(p string) string {
		b, _ := os.ReadFile(p)
		return string(b)
	}
	v1 := cgroupHost{v1: map[string]string{"freezer": filepath.Join(dir, "freezer")}}
	state := write("freezer/wb/g1/freezer.state", "FROZEN\n")
	if !v1.thaw("/wb/g1") || read(state) != "THAWED" {
		t.Fatalf("v1 thaw: freezer.state %q", read(state))
	}
	v2 := cgroupHost{v2: true, v2Root: filepath.Join(dir, "unified")}
	freeze := write("unified/wb/g1/cgroup.freeze", "1\n")
	if !v2.thaw("/wb/g1") || read(freeze) != "0" {
		t.Fatalf("v2 thaw: cgroup.freeze %q", read(freeze))
	}
	for name, h := range map[string]cgroupHost{"no cgroup": v2, "no freezer": {v1: map[string]string{"memory": dir}}} {
		if h.thaw("/wb/gone") {
			t.Errorf("%s: thaw reported true", name)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "unified/wb/gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a thaw of a missing cgroup made a file: %v", err)
	}
}

func TestOCISpec(t *testing.T) {
	s := hypervisor.Spec{
		ID: "g1", RootFS: "/tpl/rootfs", Writable: "/w", AgentDir: "/a", AgentBin: "/bin/wb",
		Args:          []string{"/run/wb-bin/wb", "agent"},
		ReadOnlyBinds: []hypervisor.Bind{{Source: "/usr/lib/x", Target: "/usr/lib/x"}, {Source: "/usr", Target: "/usr"}},
		VCPU:          2, MemoryMiB: 512, Pids: 100,
	}
	sc, err := defaultSeccomp()
	if err != nil || sc.DefaultAction != specs.ActErrno || len(sc.Syscalls) < 10 {
		t.Fatalf("default seccomp profile: %+v, %v", sc, err)
	}
	for _, runsc := range []bool{false, true} {
		c := ociSpec(s, specOptions{runsc: runsc, cgroupsPath: "/wb/g1", swap: true, nofile: 1024, seccomp: sc})
		if !c.Root.Readonly || c.Root.Path != s.RootFS {
			t.Fatalf("root = %+v", c.Root)
		}
		docker := []string{"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_MKNOD",
			"CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"}
		if runsc {
			// runsc's agent gets CAP_SYS_ADMIN to mount gVisor's pids cgroup, and drops it.
			docker = slices.Sorted(slices.Values(append(docker, "CAP_SYS_ADMIN")))
		}
		pc := c.Process.Capabilities
		for _, set := range [][]string{pc.Bounding, pc.Effective, pc.Permitted} {
			if !slices.Equal(slices.Sorted(slices.Values(set)), docker) {
				t.Fatalf("capabilities %v, want Docker's default %v", set, docker)
			}
		}
		if !c.Process.NoNewPrivileges || len(pc.Inheritable) != 0 || len(pc.Ambient) != 0 {
			t.Fatalf("process privileges: %+v", c.Process)
		}
		if c.Linux.Seccomp == nil || c.Linux.Seccomp.DefaultAction != specs.ActErrno || len(c.Linux.Seccomp.Syscalls) < len(sc.Syscalls) {
			t.Fatal("no seccomp profile")
		}
		for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"} {
			if !slices.Contains(c.Linux.MaskedPaths, p) {
				t.Fatalf("%s is not masked: %v", p, c.Linux.MaskedPaths)
			}
		}
		if !slices.Contains(c.Linux.ReadonlyPaths, "/proc/sys") {
			t.Fatalf("/proc/sys is not read-only: %v", c.Linux.ReadonlyPaths)
		}
		hasUserNS := slices.ContainsFunc(c.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.UserNamespace })
		if hasUserNS == runsc {
			t.Fatalf("runsc=%v: user namespace %v", runsc, hasUserNS)
		}
		if !runsc {
			want := []specs.LinuxIDMapping{{ContainerID: 0, HostID: guestRootID, Size: guestIDCount}}
			if !slices.Equal(c.Linux.UIDMappings, want) || !slices.Equal(c.Linux.GIDMappings, want) || guestRootID == 0 {
				t.Fatalf("id mappings %v %v", c.Linux.UIDMappings, c.Linux.GIDMappings)
			}
		}
		other := s
		other.Args = []string{"/bin/sh", "-c", "sleep 1"}
		if o := ociSpec(other, specOptions{runsc: runsc, cgroupsPath: "/wb/g1", nofile: 1024}).Process; slices.Contains(o.Capabilities.Bounding, "CAP_SYS_ADMIN") || slices.ContainsFunc(o.Env, func(e string) bool { return strings.HasPrefix(e, agentPidsMaxEnv) }) {
			t.Fatalf("an init that is not the agent gets the agent's privileges: %+v", o)
		}
		if got := slices.Contains(c.Process.Env, agentPidsMaxEnv+"=100"); got != runsc { // 512 MiB allows 128
			t.Fatalf("runsc %v: the agent's process limit in the env %v: %v", runsc, c.Process.Env, got)
		}
		var ns []specs.LinuxNamespaceType
		for _, n := range c.Linux.Namespaces {
			if n.Path != "" {
				t.Fatalf("namespace %s joins %s", n.Type, n.Path)
			}
			ns = append(ns, n.Type)
		}
		for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace} {
			if !slices.Contains(ns, want) {
				t.Fatalf("namespaces %v lack %s", ns, want)
			}
		}
		r := c.Linux.Resources
		if *r.CPU.Quota != 200000 || *r.CPU.Period != 100000 || *r.Memory.Limit != 512<<20 || *r.Memory.Swap != 512<<20 {
			t.Fatalf("resources = %+v %+v", r.CPU, r.Memory)
		}
		wantPids := int64(100)
		if runsc {
			wantPids = runscHostPidsMin
		}
		if *r.Pids.Limit != wantPids {
			t.Fatalf("pids = %d, want %d", *r.Pids.Limit, wantPids)
		}
		idx := map[string]int{}
		for i, m := range c.Mounts {
			idx[m.Destination] = i
			if m.Type == "bind" && m.Destination != "/workspace" && m.Destination != "/tmp" && m.Destination != "/root" && m.Destination != "/run/wb" && !slices.Contains(m.Options, "ro") {
				t.Fatalf("bind %s is not read-only: %v", m.Destination, m.Options)
			}
			writable := m.Type == "tmpfs" || m.Type == "bind" && !slices.Contains(m.Options, "ro")
			if writable && !slices.Contains(m.Options, "nosuid") {
				t.Fatalf("writable %s is not nosuid: %v", m.Destination, m.Options)
			}
			if writable && m.Destination != "/workspace" && (!slices.Contains(m.Options, "noexec") || m.Destination != "/dev" && !slices.Contains(m.Options, "nodev")) {
				t.Fatalf("writable %s is not nosuid,nodev,noexec: %v", m.Destination, m.Options)
			}
			if (m.Destination == "/usr" || m.Destination == "/usr/lib/x") && slices.Contains(m.Options, "rro") == runsc {
				t.Fatalf("runsc=%v: toolchain bind %s options %v", runsc, m.Destination, m.Options)
			}
		}
		for _, d := range []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/sys", "/usr", "/usr/lib/x", "/workspace", "/tmp", "/root", "/run/wb", "/run/wb-bin/wb"} {
			if _, ok := idx[d]; !ok {
				t.Fatalf("no mount at %s", d)
			}
		}
		if idx["/usr"] > idx["/usr/lib/x"] {
			t.Fatal("/usr is mounted over /usr/lib/x")
		}
		if c.Mounts[idx["/workspace"]].Source != "/w/workspace" || c.Linux.CgroupsPath != "/wb/g1" {
			t.Fatalf("workspace source %s, cgroups path %s", c.Mounts[idx["/workspace"]].Source, c.Linux.CgroupsPath)
		}
		if !slices.Contains(c.Process.Env, defaultPath) || c.Process.Cwd != "/workspace" {
			t.Fatalf("process env %v cwd %s", c.Process.Env, c.Process.Cwd)
		}
	}
}

func TestLayerRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "workspace", "a", "b"), 0o755))
	must(os.WriteFile(filepath.Join(src, "workspace", "a", "b", "f.txt"), []byte("data"), 0o640))
	must(os.Symlink("/etc/passwd", filepath.Join(src, "workspace", "abs-link")))
	must(os.Mkdir(filepath.Join(src, "tmp"), 0o755))
	must(os.Chmod(filepath.Join(src, "tmp"), os.ModeSticky|0o777))
	tarPath := filepath.Join(t.TempDir(), "l.tar")
	must(writeLayer(ctx, src, tarPath, 0))
	dst := filepath.Join(t.TempDir(), "w")
	must(readLayer(ctx, tarPath, dst))
	b, err := os.ReadFile(filepath.Join(dst, "workspace", "a", "b", "f.txt"))
	if err != nil || string(b) != "data" {
		t.Fatalf("file: %q %v", b, err)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "workspace", "a", "b", "f.txt")); fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(dst, "tmp")); fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("tmp mode %v", fi.Mode())
	}
	if l, err := os.Readlink(filepath.Join(dst, "workspace", "abs-link")); err != nil || l != "/etc/passwd" {
		t.Fatalf("symlink %q %v", l, err)
	}
	if err := readLayer(ctx, tarPath, dst); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("unpack into a non-empty dir: %v", err)
	}

	// Hostile archives cannot write outside the destination.
	for name, entries := range map[string][]tar.Header{
		"dotdot":       {{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"absolute":     {{Name: "/escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		"through-link": {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: filepath.Dir(dst)}, {Name: "l/escape", Typeflag: tar.TypeReg, Mode: 0o644}},
	} {
		p := filepath.Join(t.TempDir(), name+".tar")
		f, err := os.Create(p)
		must(err)
		tw := tar.NewWriter(f)
		for _, h := range entries {
			must(tw.WriteHeader(&h))
		}
		must(tw.Close())
		must(f.Close())
		out := filepath.Join(t.TempDir(), "out")
		if err := readLayer(ctx, p, out); err == nil {
			t.Errorf("%s: hostile layer unpacked", name)
		}
		if _, err := os.Lstat(filepath.Join(filepath.Dir(out), "escape")); err == nil {
			t.Errorf("%s: file escaped the destination", name)
		}
	}
}

// A snapshot record is a file on the node's disk; a layer name in it that climbs out of the
// snapshot's directory is refused before any path is opened.
func TestRestoreRefusesLayerOutsideSnapshot(t *testing.T) {
	base := t.TempDir()
	spec := hypervisor.Spec{ID: "g1", RootFS: "/nonexistent-rootfs", Writable: filepath.Join(base, "w"),
		AgentDir: filepath.Join(base, "a"), Args: []string{"/wb", "agent"}}
	for _, layer := range []string{"../../etc/passwd", "/etc/passwd", "..", "", "a/b", `..\x`} {
		dir := filepath.Join(base, "snap")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeJSON(filepath.Join(dir, snapshotMeta), snapshotRecord{Format: snapshotFormat, Runtime: "runc", Layer: layer}); err != nil {
			t.Fatal(err)
		}
		err := (&Driver{name: "runc"}).Restore(context.Background(), spec, dir)
		if err == nil || !strings.Contains(err.Error(), "not a plain file name") {
			t.Fatalf("layer %q: %v", layer, err)
		}
	}
	for _, ok := range []string{"writable.tar", "layer-2.tar"} {
		if !plainFileName(ok) {
			t.Fatalf("%q refused", ok)
		}
	}
}

// The guest's own process limit sits well below its sandbox's host limit under runsc, whose
// ptrace platform spends many host tasks per guest process; under runc they are one.
func TestPidsLimits(t *testing.T) {
	if agentPidsMaxEnv != agent.PidsMaxEnv {
		t.Fatalf("the driver sets %s, the agent reads %s", agentPidsMaxEnv, agent.PidsMaxEnv)
	}
	for _, c := range []struct {
		pids, memoryMiB int
		runsc           bool
		host, guest     int64
	}{
		{0, 0, false, 0, 0}, {0, 256, true, 0, 0},
		{1024, 256, false, 1024, 0},
		{1024, 0, true, runscPidsBase + 1024*runscPidsPerProc, runscGuestPidsMax},
		{1024, 4096, true, runscPidsBase + 1024*runscPidsPerProc, runscGuestPidsMax},
		{1024, 256, true, runscPidsBase + 1024*runscPidsPerProc, 64},
		{1024, 64, true, runscPidsBase + 1024*runscPidsPerProc, runscGuestPidsMin},
		{128, 0, true, runscHostPidsMin, 128},
	} {
		host, guest := pidsLimits(c.pids, c.memoryMiB, c.runsc)
		if host != c.host || guest != c.guest {
			t.Errorf("pidsLimits(%d, %d MiB, runsc %v) = host %d, guest %d; want %d, %d", c.pids, c.memoryMiB, c.runsc, host, guest, c.host, c.guest)
		}
		if c.runsc && c.pids > 0 && guest*runscPidsPerProc > host {
			t.Errorf("runsc %d: the guest limit %d leaves the host limit %d no headroom", c.pids, guest, host)
		}
	}
}

// TestFailedMountLeavesNoMount: a disk image whose mount fails (here it holds no file
// system) leaves neither a mount nor a loop device attached to it, and the guest does not
// start; a good one mounts, and its loop device goes with its unmount.
func TestFailedMountLeavesNoMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a loop device: needs root")
	}
	d := &Driver{log: slog.New(slog.NewTextHandler(io.Discard, nil)), diskTemplates: t.TempDir()}
	s := hypervisor.Spec{ID: "g-mount", Writable: filepath.Join(t.TempDir(), "writable"), DiskGiB: 1}
	if err := os.WriteFile(diskImage(s), bytes.Repeat([]byte("not ext4"), 1<<16), 0o600); err != nil {
		t.Fatal(err)
	}
	err := d.attachDisk(context.Background(), s)
	if err == nil || !strings.Contains(err.Error(), "mount") || !strings.Contains(err.Error(), "disk limit") {
		t.Fatalf("attachDisk of an image without a file system = %v, want the failed mount named", err)
	}
	if mounted(s.Writable) {
		_ = syscall.Unmount(s.Writable, syscall.MNT_DETACH)
		t.Fatal("the failed mount is still mounted")
	}
	if devs := loopsOf(t, diskImage(s)); len(devs) > 0 {
		t.Fatalf("the failed mount left loop devices %v attached to the image", devs)
	}

	s.ID, s.Writable = "g-mount2", filepath.Join(t.TempDir(), "writable")
	if err := d.attachDisk(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if !mounted(s.Writable) {
		t.Fatal("the guest's disk is not mounted")
	}
	if devs := loopsOf(t, diskImage(s)); len(devs) != 1 {
		t.Fatalf("the mounted image is on loop devices %v, want one", devs)
	}
	if err := os.WriteFile(filepath.Join(s.Writable, "f"), []byte("x"), 0o644); err != nil {
		t.Fatalf("write on the guest's disk: %v", err)
	}
	if err := detachDisk(s); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(loopsOf(t, diskImage(s))) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("loop devices %v still attached 10 s after the unmount", loopsOf(t, diskImage(s)))
		}
	}
}

// loopsOf answers the loop devices backed by file (deleted or not).
func loopsOf(t *testing.T, file string) []string {
	t.Helper()
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == file {
			out = append(out, filepath.Base(filepath.Dir(filepath.Dir(p))))
		}
	}
	return out
}

// TestDiskTemplate: guests' disk images are copies of one template per size, formatted once
// (mkfs.ext4 ran per guest, about 10 ms of CPU each); each copy is a file system of its own,
// of the size asked, and sparse.
func TestDiskTemplate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts loop devices: needs root")
	}
	real, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Skip("no mkfs.ext4")
	}
	bin := t.TempDir()
	calls := filepath.Join(bin, "calls")
	wrapper := "#!/bin/sh\necho \"$*\" >> " + calls + "\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "mkfs.ext4"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	d := &Driver{log: slog.New(slog.NewTextHandler(io.Discard, nil)), diskTemplates: t.TempDir()}
	// An upgraded node's data dir holds an earlier version's templates, and files of others.
	for _, f := range []string{"ext4-v2-1g-u0.img", "ext4-v1-1g.img", "notes"} {
		if err := os.WriteFile(filepath.Join(d.diskTemplates, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var disks []hypervisor.Spec
	for i := range 3 {
		s := hypervisor.Spec{ID: fmt.Sprintf("g%d", i), Writable: filepath.Join(t.TempDir(), "writable"), DiskGiB: 1 + i/2}
		if err := d.attachDisk(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = detachDisk(s) })
		disks = append(disks, s)
	}
	b, _ := os.ReadFile(calls)
	if n := strings.Count(string(b), "\n"); n != 2 {
		t.Fatalf("mkfs.ext4 ran %d times for 3 disks of 2 sizes, want once a size:\n%s", n, b)
	}
	var names []string
	es, _ := os.ReadDir(d.diskTemplates)
	for _, e := range es {
		names = append(names, e.Name())
	}
	if want := []string{diskTemplateVersion + "1g-u0.img", diskTemplateVersion + "2g-u0.img", "notes"}; !slices.Equal(names, want) {
		t.Errorf("the templates dir holds %q, want %q (an earlier version's templates removed, other files kept)", names, want)
	}
	if err := os.WriteFile(filepath.Join(disks[0].Writable, "mine"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, s := range disks {
		var st unix.Statfs_t
		if err := unix.Statfs(s.Writable, &st); err != nil {
			t.Fatal(err)
		}
		if got, want := int64(st.Blocks)*st.Bsize, int64(s.DiskGiB)<<30; got > want || got < want*9/10 {
			t.Errorf("disk %d: %d bytes, want about %d", i, got, want)
		}
		if _, err := os.Stat(filepath.Join(s.Writable, "mine")); (i == 0) != (err == nil) {
			t.Errorf("disk %d: a file written on disk 0 is seen: %v", i, err == nil)
		}
		var fi unix.Stat_t
		if err := unix.Stat(diskImage(s), &fi); err != nil {
			t.Fatal(err)
		}
		if fi.Blocks*512 > 1<<20 {
			t.Errorf("disk %d: its image holds %d bytes, want a sparse copy of the template's metadata", i, fi.Blocks*512)
		}
	}
}

// TestDiskTemplateHoldsTheLayerDirs: a guest's new disk, copied from the template, holds the
// dirs of every writable layer (hypervisor.WritableMounts) before prepare makes sure of them,
// with their modes and guest root as owner (runc's user namespace), dated now as if made for
// the guest, and nothing else (no lost+found): made in each guest's fresh file system they
// were about 1.5 ms of CPU a guest.
func TestDiskTemplateHoldsTheLayerDirs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts loop devices: needs root")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4")
	}
	d := &Driver{name: RuntimeRunc, log: slog.New(slog.NewTextHandler(io.Discard, nil)), diskTemplates: t.TempDir()}
	for i := range 2 { // the first makes the template, the second copies it as made
		s := hypervisor.Spec{ID: fmt.Sprintf("g%d", i), Writable: filepath.Join(t.TempDir(), "writable"), DiskGiB: 1}
		time.Sleep(2500 * time.Millisecond) // the template's dirs are older than this guest
		began := time.Now().Add(-time.Second)
		if err := d.attachDisk(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = detachDisk(s) })
		ents, err := os.ReadDir(s.Writable)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		want := []string{"root", "tmp", "workspace"}
		if !slices.Equal(names, want) {
			t.Fatalf("disk %d: the new layer holds %v, want %v", i, names, want)
		}
		for _, w := range hypervisor.WritableMounts() {
			fi, err := os.Lstat(filepath.Join(s.Writable, w.Subdir))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if got := uint32(fi.Mode().Perm()) | uint32(st.Mode&syscall.S_ISVTX); !fi.IsDir() || got != w.Mode || st.Uid != guestRootID || st.Gid != guestRootID {
				t.Errorf("disk %d: %s is %v (mode %o), owned by %d:%d; want a dir of mode %o owned by %d", i, w.Subdir, fi.Mode(), got, st.Uid, st.Gid, w.Mode, guestRootID)
			}
			if fi.ModTime().Before(began) {
				t.Errorf("disk %d: %s dated %s, before the guest's disk was made (%s)", i, w.Subdir, fi.ModTime(), began)
			}
		}
	}
}

// TestLayerBounded: a sparse file costs its guest no disk, but the layer's tar holds its whole
// size (archive/tar writes no holes): past the guest's disk allowance the snapshot fails at
// once, naming the cause, before it writes the file, instead of filling the host's disk.
func TestLayerBounded(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "small"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	sparse, err := os.Create(filepath.Join(src, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(sparse.Truncate(64<<20), sparse.Close()); err != nil { // 64 MiB, no block
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "l.tar")
	err = writeLayer(context.Background(), src, tarPath, 1<<20)
	if err == nil || !strings.Contains(err.Error(), "sparse") {
		t.Fatalf("a layer of 64 MiB (sparse) within 1 MiB: %v; want an error naming sparse files", err)
	}
	if fi, err := os.Stat(tarPath); err == nil && fi.Size() > 1<<20 {
		t.Errorf("the failed layer's tar is %d bytes; want it to stop before the file", fi.Size())
	}
	if err := writeLayer(context.Background(), src, filepath.Join(t.TempDir(), "ok.tar"), 128<<20); err != nil {
		t.Errorf("the same layer within 128 MiB: %v", err)
	}
	if err := checkLayerSize(src, 1<<20); err == nil || !strings.Contains(err.Error(), "sparse") {
		t.Errorf("checkLayerSize within 1 MiB: %v; want writeLayer's refusal", err)
	}
	if err := checkLayerSize(src, 128<<20); err != nil {
		t.Errorf("checkLayerSize within 128 MiB: %v", err)
	}
}

// TestSlowStartWarned: a runtime's start of a guest that runs past its warning's time is
// logged while it still runs, naming the command and the guest (a start past a session's
// provisioning deadline left no trace before it ended); a quick one logs nothing.
func TestSlowStartWarned(t *testing.T) {
	var out syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- startsGuest(context.Background(), log, 50*time.Millisecond, "runsc create", "sess_slowstart", func(context.Context) error {
			<-release
			return nil
		})
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "slow"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("no warning of a start still running after its warning's time")
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.Contains(got, `command="runsc create"`) || !strings.Contains(got, "id=sess_slowstart") {
		t.Fatalf("the warning names neither the command nor the guest: %s", got)
	}
	var quick syncbuf.Buffer
	if err := startsGuest(context.Background(), slog.New(slog.NewTextHandler(&quick, nil)), 200*time.Millisecond, "runsc create", "sess_quick", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if quick.String() != "" {
		t.Fatalf("a quick start was warned of: %s", quick.String())
	}
}

// A runsc guest's agent runs Go's scheduler on one thread (agentProcsProcess); a runc guest's
// keeps Go's default, and an init that is not the agent gets nothing.
func TestAgentGoMaxProcsUnderRunsc(t *testing.T) {
	if agentGoMaxProcsEnv != agent.GoMaxProcsEnv {
		t.Fatalf("the driver sets %s, the agent reads %s", agentGoMaxProcsEnv, agent.GoMaxProcsEnv)
	}
	s := hypervisor.Spec{ID: "g1", RootFS: "/rootfs", Args: []string{hypervisor.GuestAgentBin, "agent"}}
	for _, runsc := range []bool{true, false} {
		env := ociSpec(s, specOptions{runsc: runsc, cgroupsPath: "/wb/g1", nofile: 1024}).Process.Env
		if got := slices.Contains(env, agentGoMaxProcsEnv+"=1"); got != runsc {
			t.Fatalf("runsc %v: %s=1 in the agent's env %v: %v", runsc, agentGoMaxProcsEnv, env, got)
		}
	}
	other := s
	other.Args = []string{"/bin/sh", "-c", "sleep 1"}
	if env := ociSpec(other, specOptions{runsc: true, cgroupsPath: "/wb/g1", nofile: 1024}).Process.Env; slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, agentGoMaxProcsEnv) }) {
		t.Fatalf("an init that is not the agent gets the agent's %s: %v", agentGoMaxProcsEnv, env)
	}
}

// TestCheckpointSandboxAbsent: a guest whose sandbox has no control socket where this runsc
// build puts it is left to `runsc checkpoint` (errNoDirectCheckpoint), with nothing written
// into its image directory, which runsc checkpoint wants without its image file.
func TestCheckpointSandboxAbsent(t *testing.T) {
	img := t.TempDir()
	err := checkpointSandbox(t.Context(), fmt.Sprintf("no-such-guest-%d", os.Getpid()), img)
	if !errors.Is(err, errNoDirectCheckpoint) {
		t.Fatalf("checkpointSandbox of a guest with no sandbox: %v; want errNoDirectCheckpoint", err)
	}
	if ents, _ := os.ReadDir(img); len(ents) != 0 {
		t.Fatalf("the image dir holds %v after a checkpoint that was not asked", ents)
	}
}

// TestRunscBuildKnown: only the runsc build checkpointSandbox was tested against is sent its
// call; any other, or an answer that is not runsc's, is left to runsc checkpoint.
func TestRunscBuildKnown(t *testing.T) {
	for version, want := range map[string]bool{
		"runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n": true,
		"runsc version release-20221219.0\n":              true,
		"runsc version release-20240807.0\nspec: 1.1.0\n": false,
		"runc version 1.1.5\n":                            false,
		"spec: 20221219\n":                                false,
		"":                                                false,
	} {
		if got := runscBuildKnown([]byte(version)); got != want {
			t.Errorf("runscBuildKnown(%q) = %v, want %v", version, got, want)
		}
	}
}

// fakeSandbox listens where runsc 20221219's sandbox of guest id has its control socket and
// sends what each connection writes to calls.
func fakeSandbox(t *testing.T, id string) <-chan []byte {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@runsc-sandbox." + id + "\x00", Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	calls := make(chan []byte, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(io.LimitReader(c, 4096))
				calls <- b
			}()
		}
	}()
	return calls
}

// TestCheckpointSandboxCancelled: a checkpoint whose context has ended is not asked of the
// sandbox, as runsc checkpoint, whose process is then not started, is not: the sandbox saves
// what it was asked whatever happens to the caller, and the save stops the guest, which the
// caller was told had not been checkpointed.
func TestCheckpointSandboxCancelled(t *testing.T) {
	id := fmt.Sprintf("qrev-cancelled-%d", os.Getpid())
	calls := fakeSandbox(t, id)
	for i := range 20 {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := checkpointSandbox(ctx, id, t.TempDir())
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("attempt %d: checkpointSandbox with an ended context: %v; want context.Canceled", i, err)
		}
	}
	deadline := time.After(time.Second)
	for {
		select {
		case b := <-calls:
			if len(b) > 0 {
				t.Fatalf("checkpointSandbox with an ended context sent the sandbox %q", b)
			}
		case <-deadline:
			return
		}
	}
}

// runscWaitersAnswer is how runsc 20221219's sandbox answers a checkpoint of a guest whose
// process waits in epoll on a TCP listener on port 5000 (cut: the real dump of the endpoint
// is 13 kB, and the goroutine stacks after it longer).
const runscWaitersAnswer = `encoding error at object tcp.endpoint{TCPEndpointStateInner:stack.TCPEndpointStateInner{TSOffset:tcp.TSOffset{milliseconds:0x0}, SACKPermitted:false}, TransportEndpointInfo:stack.TransportEndpointInfo{NetProto:0x800, TransProto:0x6, ID:stack.TransportEndpointID{LocalPort:0x1388, LocalAddress:"\x7f\x00\x00\x01", RemotePort:0x0, RemoteAddress:""}, BindNICID:0}, waiterQueue:(*waiter.Queue)(0xc000402d80), acceptQueue:tcp.acceptQueue{pendingEndpoints:map[*tcp.endpoint]struct {}{}, capacity:129}, listenCtx:(*tcp.listenContext)(0xc00017a900)}: endpoint still has waiters upon save:
goroutine 105 [running]:
gvisor.dev/gvisor/pkg/state.safely.func1()
	gvisor.dev/gvisor/pkg/state/state.go:308 +0x17d
panic({0xe7f040, 0x1235dd8})
	runtime/panic.go:884 +0x212
`

// TestCheckpointFailureIsReadable: a save the sandbox refuses is answered with what a person
// can act on (the object, its port, the reason and what to do), not runsc's dump of the
// object and its goroutine stacks, which reached the tenant's snapshot error whole.
func TestCheckpointFailureIsReadable(t *testing.T) {
	id := fmt.Sprintf("qrev-refused-%d", os.Getpid())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@runsc-sandbox." + id + "\x00", Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		b, oob := make([]byte, 4096), make([]byte, 64)
		_, oobn, _, _, err := c.ReadMsgUnix(b, oob)
		if err != nil {
			return
		}
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				fds, _ := unix.ParseUnixRights(&m)
				for _, fd := range fds {
					_ = unix.Close(fd)
				}
			}
		}
		answer, _ := json.Marshal(map[string]any{"success": false, "err": runscWaitersAnswer})
		_, _ = c.Write(answer)
	}()
	err = checkpointSandbox(t.Context(), id, t.TempDir())
	want := "checkpoint failed: encoding error at object tcp.endpoint (local port 5000): endpoint still has waiters upon save; " +
		"gVisor cannot save a TCP socket that a guest process waits on in epoll, poll or select (a server's event loop): " +
		"stop that process or close the socket before a memory snapshot, or take the snapshot without memory"
	if err == nil || err.Error() != want {
		t.Fatalf("a refused save answered\n%v\nwant\n%s", err, want)
	}
	if got := saveFailure(strings.Repeat("x", 5000)); len(got) > 1100 {
		t.Fatalf("an answer of 5000 bytes gave an error of %d", len(got))
	}
}

// TestCheckpointAnswerIsBounded: the sandbox's answer to a checkpoint is read up to a bound:
// the sandbox runs what the guest runs, and an answer without end would have the node read,
// and hold, all of it.
func TestCheckpointAnswerIsBounded(t *testing.T) {
	id := fmt.Sprintf("qrev-endless-%d", os.Getpid())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@runsc-sandbox." + id + "\x00", Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	const offered = 64 << 20
	wrote := make(chan int, 1)
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			wrote <- 0
			return
		}
		defer c.Close()
		b, oob := make([]byte, 4096), make([]byte, 64)
		_, oobn, _, _, _ := c.ReadMsgUnix(b, oob)
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				fds, _ := unix.ParseUnixRights(&m)
				for _, fd := range fds {
					_ = unix.Close(fd)
				}
			}
		}
		n, _ := c.Write([]byte(`{"success":false,"err":"`))
		chunk := bytes.Repeat([]byte("x"), 1<<16)
		for n < offered {
			k, err := c.Write(chunk)
			n += k
			if err != nil {
				break
			}
		}
		wrote <- n
	}()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := checkpointSandbox(ctx, id, t.TempDir()); err == nil {
		t.Fatal("an endless answer was taken for a checkpoint")
	}
	if n := <-wrote; n > 8<<20 {
		t.Fatalf("the sandbox's answer was read to %d bytes", n)
	}
}

// TestSealAgentDirAsksNoRuntime: a runc guest whose agent is slow to bind its socket (here
// 0.5 s, past two of the wait's checks that the guest still lives) is waited for without
// `runc state`: the driver created it, so its init's process says whether it lives. Each
// `runc state` was a process start, about 9 ms of CPU, every 200 ms of a slow agent's start.
func TestSealAgentDirAsksNoRuntime(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("seals the agent dir (chown to root): needs root")
	}
	bin := t.TempDir()
	calls := filepath.Join(bin, "calls")
	state := `{"ociVersion":"1.0.2","id":"g1","pid":1,"status":"running","bundle":"/","rootfs":"/","created":"2020-01-01T00:00:00Z"}`
	script := "#!/bin/sh\necho \"$*\" >> " + calls + "\necho '" + state + "'\n"
	if err := os.WriteFile(filepath.Join(bin, "runc"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &Driver{name: RuntimeRunc, rt: &gorunc.Runc{Command: filepath.Join(bin, "runc"), Root: t.TempDir()},
		bundleRoot: t.TempDir(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), inits: map[string]initProc{}}
	s := hypervisor.Spec{ID: "g1", AgentDir: t.TempDir(), AgentSocket: "agent.sock"}
	if err := os.MkdirAll(d.BundleDir(s.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(d.BundleDir(s.ID), guestFile), guestRecord{Spec: s, Runtime: RuntimeRunc}); err != nil {
		t.Fatal(err)
	}
	init := exec.Command("sleep", "60") // the guest's init, as the driver's create found it
	if err := init.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = init.Process.Kill(); _ = init.Wait() })
	start, ok := proc.Start(init.Process.Pid)
	if !ok {
		t.Fatal("no start time of the init")
	}
	d.inits[s.ID] = initProc{pid: init.Process.Pid, start: start, state: hypervisor.StateRunning}
	sock := filepath.Join(s.AgentDir, s.AgentSocket) // s changes below, for the second guest
	go func() {
		time.Sleep(500 * time.Millisecond)
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { l.Close() })
	}()
	if err := d.sealAgentDir(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(calls); len(b) > 0 {
		t.Errorf("waiting for the agent's socket ran the runtime:\n%s", b)
	}

	// A guest whose init died is still given up on, from its process alone.
	s.ID, s.AgentDir = "g2", t.TempDir()
	if err := os.MkdirAll(d.BundleDir(s.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(d.BundleDir(s.ID), guestFile), guestRecord{Spec: s, Runtime: RuntimeRunc}); err != nil {
		t.Fatal(err)
	}
	_ = init.Process.Kill()
	_ = init.Wait()
	d.inits[s.ID] = initProc{pid: init.Process.Pid, start: start, state: hypervisor.StateRunning}
	if err := d.sealAgentDir(context.Background(), s); err == nil || !strings.Contains(err.Error(), "exited before its agent listened") {
		t.Errorf("a guest whose init died: %v, want it exited", err)
	}
	if b, _ := os.ReadFile(calls); len(b) > 0 {
		t.Errorf("a guest whose init died was asked of the runtime:\n%s", b)
	}
}

// TestGoferGone: the driver's own delete of a runsc guest whose sandbox died SIGKILLs its
// gofer, and never signals a process that merely has the gofer's pid (its command line does
// not name the driver's state root and the guest's bundle).
func TestGoferGone(t *testing.T) {
	d := &Driver{name: RuntimeRunsc, rt: &gorunc.Runc{Root: t.TempDir()}, bundleRoot: t.TempDir(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	start := func(args ...string) *exec.Cmd {
		c := exec.Command("python3", append([]string{"-c", "import time; time.sleep(60)"}, args...)...)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		// Until it has exec'd, its command line is this test's (and no gofer's).
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.Process.Pid)); strings.Contains(string(b), "gofer") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the stand-in gofer did not start within 10 s")
			}
		}
		return c
	}
	exited := func(c *exec.Cmd) bool {
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	}
	other := start("gofer", "--root=/elsewhere", d.BundleDir("g1"))
	t0 := time.Now()
	if !d.goferGone(context.Background(), "g1", other.Process.Pid) {
		t.Fatal("a process that is not the guest's gofer: goferGone false, want true (the gofer is gone)")
	}
	if took := time.Since(t0); took > time.Second {
		t.Errorf("a process that is not the gofer was waited for %s", took)
	}
	if !proc.Alive(other.Process.Pid, "") {
		t.Fatal("a process that is not the guest's gofer was killed")
	}
	// Another guest's gofer under this driver's root, and a gofer of the same guest id under
	// another node's root (another driver on the host): neither is g1's.
	for _, args := range [][]string{
		{"gofer", "--root=" + d.rt.Root, "--bundle", d.BundleDir("g2")},
		{"gofer", "--root=" + d.rt.Root + "2", "--bundle", d.BundleDir("g1")},
	} {
		c := start(args...)
		if !d.goferGone(context.Background(), "g1", c.Process.Pid) || !proc.Alive(c.Process.Pid, "") {
			t.Fatalf("a process with the command line %q was killed as g1's gofer", args)
		}
	}
	gofer := start("gofer", "--root="+d.rt.Root, "--bundle", d.BundleDir("g1"))
	if !d.goferGone(context.Background(), "g1", gofer.Process.Pid) {
		t.Fatal("a gofer: goferGone false, want it killed")
	}
	if !exited(gofer) {
		t.Fatal("the gofer was not killed")
	}
}

// TestCgroupEmptyWithin: the driver's own delete of a runsc guest waits until the sandbox's
// last processes have left its cgroups, which can be removed then: removed at once, while a
// loaded host still ran the killed sandbox's ptrace stubs, they stayed busy and were left.
func TestCgroupEmptyWithin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("makes cgroups: needs root")
	}
	cg, err := detectCgroups("/proc/self/mountinfo", "/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		t.Fatal(err)
	}
	p := fmt.Sprintf("/wbtest-empty-%d", os.Getpid())
	dirs := cg.dirs(p)
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Skipf("cannot make cgroup %s: %v", d, err)
		}
	}
	t.Cleanup(func() { _ = cg.removeDirs(p) })
	late := exec.Command("sleep", "0.4") // a stub that outlives its sandbox
	if err := late.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = late.Wait() }()
	for _, d := range dirs {
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} { // a v1 cpuset takes no process without them
			if v, err := os.ReadFile(filepath.Join(filepath.Dir(d), f)); err == nil {
				_ = os.WriteFile(filepath.Join(d, f), v, 0o644)
			}
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(late.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if cg.emptyWithin(context.Background(), p, 50*time.Millisecond) {
		t.Fatal("a cgroup with a process in it: emptyWithin true")
	}
	if !cg.emptyWithin(context.Background(), p, 10*time.Second) {
		t.Fatal("the cgroup's process exited, but emptyWithin did not see it empty")
	}
	if err := cg.removeDirs(p); err != nil {
		t.Fatalf("the emptied cgroup could not be removed: %v", err)
	}
}

// TestCgroupEmptyWithinEveryHierarchy: on cgroup v1 runsc makes a guest's cgroup in the
// hierarchies of the controllers it knows and not in the hybrid host's cgroup2 tree
// ("unified"), which systemd's hosts list first. A busy guest's cgroup missing from the
// first hierarchy was taken for empty at once, and the cgroups were removed while the killed
// sandbox's last processes still ran in them (left busy on a loaded host).
func TestCgroupEmptyWithinEveryHierarchy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("makes cgroups: needs root")
	}
	// This host's mount table with its cgroup2 tree listed first, as systemd's hybrid hosts
	// list it.
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var first, rest []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.Contains(l, " - cgroup2 ") {
			first = append(first, l)
		} else {
			rest = append(rest, l)
		}
	}
	if len(first) == 0 {
		t.Skip("no cgroup2 tree beside the v1 hierarchies")
	}
	mi := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(mi, []byte(strings.Join(append(first, rest...), "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cg, err := detectCgroups(mi, "/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		t.Fatal(err)
	}
	if cg.v2 {
		t.Skip("cgroup v2: one hierarchy")
	}
	p := fmt.Sprintf("/wbtest-every-%d", os.Getpid())
	dirs := cg.dirs(p)
	// The first hierarchy has no cgroup of this guest, as runsc leaves a hybrid host's
	// cgroup2 tree (listed first on systemd's hosts); the cpu hierarchy has one, busy.
	cpu := cg.v1["cpu"]
	if cpu == "" || filepath.Join(cpu, p) == dirs[0] {
		t.Skip("needs a cpu hierarchy that is not the first")
	}
	busy := filepath.Join(cpu, p)
	if err := os.MkdirAll(busy, 0o755); err != nil {
		t.Skipf("cannot make cgroup %s: %v", busy, err)
	}
	t.Cleanup(func() { _ = cg.removeDirs(p) })
	late := exec.Command("sleep", "0.4") // a stub that outlives its sandbox
	if err := late.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = late.Wait(); close(exited) }()
	// Before the cgroup's removal (cleanups run last first), even when the test failed early.
	t.Cleanup(func() { _ = late.Process.Kill(); <-exited })
	if err := os.WriteFile(filepath.Join(busy, "cgroup.procs"), []byte(strconv.Itoa(late.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if cg.emptyWithin(context.Background(), p, 50*time.Millisecond) {
		t.Fatalf("a process in %s, none in %s: emptyWithin true", busy, dirs[0])
	}
	if !cg.emptyWithin(context.Background(), p, 10*time.Second) {
		t.Fatal("the cgroup's process exited, but emptyWithin did not see it empty")
	}
}

// TestSandboxPids: a runsc sandbox's host tasks are reported at half its host limit, and
// again only as they grow by each further eighth; a count that stays up after the guest's
// processes ended (gVisor keeps its stubs) is not reported again, and no sandbox is reported
// more than five times however it churns. The readings are the cold run's: a bomb the
// agent's guard never saw took its sandbox from 50 host tasks to its limit, 12,416, in about
// 7 s, read every 200 ms.
func TestSandboxPids(t *testing.T) {
	const limit = runscPidsBase + 1024*runscPidsPerProc // 12,416: a session's Pids 1024
	w := newSandboxPids(limit)
	var reports []int64
	for cur := int64(50); cur <= limit; cur += 1800 / 5 {
		if w.observe(cur) {
			reports = append(reports, cur)
		}
	}
	if len(reports) == 0 || reports[0] < limit/2 || reports[0] >= limit/2+360 {
		t.Fatalf("a bomb growing 1,800 tasks a second to its limit %d: reported at %v; want first within one poll past half the limit", limit, reports)
	}
	for i := 1; i < len(reports); i++ {
		if reports[i]-reports[i-1] < limit/8 {
			t.Errorf("reported at %d, then at %d: again before another eighth of the limit", reports[i-1], reports[i])
		}
	}
	if len(reports) > 5 {
		t.Errorf("reported %d times: %v; want 5 at most", len(reports), reports)
	}

	// The agent ended the processes at the first report; the count stays where it was.
	w = newSandboxPids(limit)
	n := 0
	for _, cur := range []int64{50, 1470, 3000, 6100, limit / 2, 6800, 6900, 6900, 6900, 7000, 6900} {
		if w.observe(cur) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("a count that stopped at 7,000 after its first report: %d reports, want 1", n)
	}
	// A workload that settles at a few dozen churning processes' cost is never reported.
	w = newSandboxPids(limit)
	for _, cur := range []int64{50, 354, 673, 940, 1173, 1282, 1335, 1373, 1462, 1468, 1468} {
		if w.observe(cur) {
			t.Errorf("reported at %d of %d: a workload that settled at 12 %% of the limit", cur, limit)
		}
	}
	// Every reading at the limit, from the first: five reports at most over any number.
	w = newSandboxPids(limit)
	n = 0
	for range 1000 {
		if w.observe(limit) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("a count stuck at the limit: %d reports, want 1", n)
	}
	w = newSandboxPids(0)
	if w.observe(1 << 40) {
		t.Error("a sandbox without a limit reported")
	}
}

// TestEventsPids: the event watch of a runsc guest reports its sandbox's host tasks from its
// pids.current against the pids.max it read at the start (half of 1,000 here), as they grow;
// a runc guest's, whose processes are the host's and meet their limit as failed forks, are
// never read. Fake cgroup files; the test process stands in for the guest's init.
func TestEventsPids(t *testing.T) {
	for _, rt := range []string{RuntimeRunsc, RuntimeRunc} {
		t.Run(rt, func(t *testing.T) {
			set, ch := fakePidsWatch(t, rt, "60")
			set("pids.max", "max") // read once, at the start: a later change is not seen
			got := pidsReported(set, ch, "400", "499", "500", "520", "600", "620", "640", "700", "760")
			want := []string{
				"500: pids the sandbox's host tasks: pids.current=500 of pids.max=1000 (50%)",
				"640: pids the sandbox's host tasks: pids.current=640 of pids.max=1000 (64%)",
			}
			if rt == RuntimeRunc {
				want = nil
			}
			if !slices.Equal(got, want) {
				t.Errorf("events as the count grew: %q; want %q", got, want)
			}
		})
	}
}

// fakePidsWatch starts the event watch of a guest of runtime rt on fake cgroup files (v2;
// pids.max 1000, pids.current current), the test process standing in for its init, and
// answers the setter of those files and the watch's events.
func fakePidsWatch(t *testing.T, rt, current string) (set func(file, v string), events <-chan hypervisor.Event) {
	t.Helper()
	root := t.TempDir()
	d := &Driver{name: rt, cg: cgroupHost{v2: true, v2Root: root}, bundleRoot: t.TempDir(),
		eventInterval: 5 * time.Millisecond, log: slog.New(slog.NewTextHandler(io.Discard, nil)), inits: map[string]initProc{}}
	s := hypervisor.Spec{ID: "g1"}
	cg := filepath.Join(root, "wb", s.ID)
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(d.BundleDir(s.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(d.BundleDir(s.ID), guestFile), guestRecord{Spec: s, CgroupsPath: "/wb/g1", Runtime: rt}); err != nil {
		t.Fatal(err)
	}
	set = func(file, v string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(cg, file), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set("memory.events", "oom 0\noom_kill 0")
	set("pids.max", "1000")
	set("pids.current", current)
	start, ok := proc.Start(os.Getpid())
	if !ok {
		t.Fatal("no start time of the test process")
	}
	d.inits[s.ID] = initProc{pid: os.Getpid(), start: start, state: hypervisor.StateRunning}
	events, err := d.Events(t.Context(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	return set, events
}

// pidsReported sets pids.current to each of counts in turn and answers the events the watch
// sent for each ("count: type detail").
func pidsReported(set func(file, v string), events <-chan hypervisor.Event, counts ...string) []string {
	var got []string
	for _, cur := range counts {
		set("pids.current", cur)
		select {
		case ev := <-events:
			got = append(got, cur+": "+ev.Type+" "+ev.Detail)
		case <-time.After(300 * time.Millisecond): // 60 polls, on a loaded host a few
		}
	}
	return got
}
