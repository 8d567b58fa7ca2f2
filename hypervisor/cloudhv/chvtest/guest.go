package chvtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/oci"
)

// VsockGuestDir is where the guest sees the vsock stand-in directory (see doc.go), and
// VsockDirEnv the variable that tells init so.
const (
	VsockGuestDir = "/run/wb-vsock"
	VsockDirEnv   = "WB_VSOCK_UNIX_DIR"
)

// guestMountPoints must exist in the root image: the guest's root is read-only, so the
// runtime cannot create them (a real VM's init needs them too).
var guestMountPoints = []string{"/proc", "/dev", "/sys", "/tmp", "/root", "/workspace", "/run"}

// guestConfig is what booting needs from the VM config.
type guestConfig struct {
	RootImage, WritableImage string
	WritableReadOnly         bool
	Init                     initProcess
	VCPU                     int
	MemoryMiB                int
}

// guest is the runc container standing in for the VM's kernel and everything on top of it.
type guest struct {
	id       string
	dir      string // state dir of this guest: rootfs/, writable/, vsock/, run/
	drv      *oci.Driver
	runc     string
	runcRoot string
	log      *slog.Logger
	spec     hypervisor.Spec
	pid      int
	started  bool
	exited   chan struct{} // closed once init is gone
	status   int           // init's exit status (valid after exited; -1: unknown)
}

func (g *guest) rootfsDir() string   { return filepath.Join(g.dir, "rootfs") }
func (g *guest) writableDir() string { return filepath.Join(g.dir, "writable") }

// VsockDir is the host side of the guest's vsock listeners.
func (g *guest) vsockDir() string { return filepath.Join(g.dir, "vsock") }
func (g *guest) runDir() string   { return filepath.Join(g.dir, "run") }

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// createGuest mounts the disks and creates the container (init not started yet).
func (v *VMM) createGuest(ctx context.Context, gc guestConfig) (_ *guest, err error) {
	drv, err := v.guestDriver()
	if err != nil {
		return nil, err
	}
	id := "chv-" + randomID()
	g := &guest{id: id, dir: filepath.Join(v.opts.StateDir, id), drv: drv, runc: v.runc,
		runcRoot: v.runcRoot, log: v.log.With("guest", id), exited: make(chan struct{}), status: -1}
	defer func() {
		if err != nil {
			g.cleanup(context.WithoutCancel(ctx))
		}
	}()
	for _, d := range []string{g.dir, g.rootfsDir(), g.writableDir(), g.vsockDir(), g.runDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if err := os.Chmod(d, 0o755); err != nil { // guest root (uid 100000) must reach them
			return nil, err
		}
	}
	if err := loopMount(ctx, gc.RootImage, g.rootfsDir(), true); err != nil {
		return nil, fmt.Errorf("disk rootfs: %w", err)
	}
	if err := loopMount(ctx, gc.WritableImage, g.writableDir(), gc.WritableReadOnly); err != nil {
		return nil, fmt.Errorf("disk writable: %w", err)
	}
	for _, p := range guestMountPoints {
		if fi, err := os.Stat(filepath.Join(g.rootfsDir(), p)); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("root image %s has no directory %s: the guest's root is read-only, so every mount point must be in the image (%s)",
				gc.RootImage, p, strings.Join(guestMountPoints, " "))
		}
	}
	binds, err := g.runOverlay()
	if err != nil {
		return nil, err
	}
	env := append(append([]string(nil), gc.Init.Env...), VsockDirEnv+"="+VsockGuestDir)
	g.spec = hypervisor.Spec{
		ID:            id,
		RootFS:        g.rootfsDir(),
		Writable:      g.writableDir(),
		AgentDir:      g.vsockDir(),
		Args:          append([]string{gc.Init.Path}, gc.Init.Args...),
		Env:           env,
		ReadOnlyBinds: binds,
		VCPU:          gc.VCPU,
		MemoryMiB:     gc.MemoryMiB,
	}
	if err := g.drv.Create(ctx, g.spec); err != nil {
		return nil, err
	}
	info, err := g.drv.Info(ctx, id)
	if err != nil {
		return nil, err
	}
	g.pid = info.Pid
	go g.watch()
	return g, nil
}

// runOverlay makes the guest's /run: a read-only host dir holding the image's /run entries
// (each bound back read-only from the image), "wb" (the mount point of the read-write vsock
// dir, which the OCI driver mounts at /run/wb) and "wb-vsock", a symlink to it. So the guest
// finds its vsock dir at /run/wb-vsock without the image having to hold one.
func (g *guest) runOverlay() ([]hypervisor.Bind, error) {
	run := g.runDir()
	binds := []hypervisor.Bind{{Source: run, Target: "/run"}}
	entries, err := os.ReadDir(filepath.Join(g.rootfsDir(), "run"))
	if err != nil {
		return nil, fmt.Errorf("root image /run: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if name == "wb" || name == filepath.Base(VsockGuestDir) {
			continue
		}
		src := filepath.Join(g.rootfsDir(), "run", name)
		fi, err := os.Stat(src)
		if err != nil {
			continue // a dangling symlink: nothing to show
		}
		if fi.IsDir() {
			err = os.Mkdir(filepath.Join(run, name), 0o755)
		} else {
			err = os.WriteFile(filepath.Join(run, name), nil, 0o644)
		}
		if err != nil {
			return nil, fmt.Errorf("guest /run: %w", err)
		}
		binds = append(binds, hypervisor.Bind{Source: src, Target: "/run/" + name})
	}
	if err := os.Mkdir(filepath.Join(run, "wb"), 0o755); err != nil {
		return nil, fmt.Errorf("guest /run: %w", err)
	}
	if err := os.Symlink("wb", filepath.Join(run, filepath.Base(VsockGuestDir))); err != nil {
		return nil, fmt.Errorf("guest /run: %w", err)
	}
	if err := makeDebugPort(run); err != nil {
		return nil, fmt.Errorf("guest /run: %w", err)
	}
	return binds, nil
}

// watch waits for init to end. The VMM is the child subreaper (see Serve), so the guest's
// init, orphaned by "runc create", is its child and its exit status can be read.
func (g *guest) watch() {
	defer close(g.exited)
	if ppid(g.pid) == os.Getpid() {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(g.pid, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err == nil {
				switch {
				case ws.Exited():
					g.status = ws.ExitStatus()
				case ws.Signaled():
					g.status = 128 + int(ws.Signal())
				}
			}
			return
		}
	}
	// Not our child (no subreaper): poll; the status stays unknown.
	for {
		info, err := g.drv.Info(context.Background(), g.id)
		if err != nil || info.State == hypervisor.StateStopped {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

func (g *guest) start(ctx context.Context) error {
	if err := g.drv.Boot(ctx, g.id); err != nil {
		return err
	}
	g.started = true
	return nil
}

// stop kills init and waits until it is gone.
func (g *guest) stop(ctx context.Context) error {
	if err := g.drv.Stop(ctx, g.id); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
		return err
	}
	select {
	case <-g.exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("guest %s: init did not end: %w", g.id, ctx.Err())
	}
}

// cleanup removes the container, unmounts the disks (their loop devices go with the last
// mount: mount -o loop sets autoclear) and removes the guest's state dir.
func (g *guest) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if g.spec.ID != "" {
		if err := g.stop(ctx); err != nil {
			g.log.Error("stop guest", "err", err)
		}
		if err := g.drv.Delete(ctx, g.id); err != nil {
			g.log.Error("delete guest", "err", err)
		}
	}
	for _, d := range []string{g.writableDir(), g.rootfsDir()} {
		if err := unmount(d); err != nil {
			g.log.Error("unmount", "dir", d, "err", err)
		}
	}
	if err := os.RemoveAll(g.dir); err != nil {
		g.log.Error("remove guest dir", "err", err)
	}
}

func loopMount(ctx context.Context, img, dir string, readOnly bool) error {
	fi, err := os.Stat(img)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (want a raw ext4 image)", img)
	}
	opts := "loop,nodev,nosuid"
	if readOnly {
		opts += ",ro"
	}
	out, err := exec.CommandContext(ctx, "mount", "-o", opts, img, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount -o %s %s: %w: %s", opts, img, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// unmount unmounts dir while it is a mount point (a detach when it is busy).
func unmount(dir string) error {
	for range 8 {
		if _, err := mountSource(dir); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err := syscall.Unmount(dir, 0); err != nil {
			if errors.Is(err, syscall.EBUSY) {
				if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
					return err
				}
				continue
			}
			if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
				return nil
			}
			return err
		}
	}
	return nil
}

// mountSource is the source (e.g. /dev/loop3) of the mount at dir in this mount namespace
// (the last one mounted there).
func mountSource(dir string) (string, error) {
	ms, err := mounts()
	if err != nil {
		return "", err
	}
	dir = filepath.Clean(dir)
	src, found := "", false
	for _, m := range ms {
		if m.point == dir && m.source != "" {
			src, found = m.source, true
		}
	}
	if !found {
		return "", fs.ErrNotExist
	}
	return src, nil
}

// mountEntry is one mount of this mount namespace: where, and from what.
type mountEntry struct{ point, source string }

// mounts lists this mount namespace's mounts, from /proc/self/mountinfo, in mount order.
func mounts() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		m := mountEntry{point: unescapeMount(fields[4])}
		if i := slices.Index(fields, "-"); i >= 0 && i+2 < len(fields) {
			m.source = fields[i+2]
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// diskCounters reads the block-layer counters of the loop device behind dir, in the names
// CH's virtio-block device uses. Latencies are not measured (0).
func diskCounters(dir string) map[string]uint64 {
	out := map[string]uint64{"read_bytes": 0, "write_bytes": 0, "read_ops": 0, "write_ops": 0,
		"write_latency_min": 0, "write_latency_max": 0, "write_latency_avg": 0,
		"read_latency_min": 0, "read_latency_max": 0, "read_latency_avg": 0}
	src, err := mountSource(dir)
	if err != nil || !strings.HasPrefix(src, "/dev/") {
		return out
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(src), "stat"))
	if err != nil {
		return out
	}
	f := strings.Fields(string(b))
	num := func(i int) uint64 {
		if i >= len(f) {
			return 0
		}
		n, _ := strconv.ParseUint(f[i], 10, 64)
		return n
	}
	out["read_ops"], out["read_bytes"] = num(0), num(2)*512
	out["write_ops"], out["write_bytes"] = num(4), num(6)*512
	return out
}

// resize changes the guest's CPU quota and memory limit (runc update).
func (g *guest) resize(ctx context.Context, vcpus int, memoryBytes int64) error {
	args := []string{"--root", g.runcRoot, "update"}
	if vcpus > 0 {
		args = append(args, "--cpu-period", "100000", "--cpu-quota", strconv.Itoa(vcpus*100000))
	}
	if memoryBytes > 0 {
		m := strconv.FormatInt(memoryBytes, 10)
		withSwap := append(append([]string(nil), args...), "--memory", m, "--memory-swap", m, g.id)
		if out, err := exec.CommandContext(ctx, g.runc, withSwap...).CombinedOutput(); err == nil {
			return nil
		} else {
			g.log.Debug("runc update with swap", "err", err, "out", string(out))
		}
		args = append(args, "--memory", m)
	}
	args = append(args, g.id)
	if out, err := exec.CommandContext(ctx, g.runc, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("runc update: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
