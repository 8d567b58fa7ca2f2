package cloudhv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv/chapi"
	"wb/hypervisor/cloudhv/image"
	"wb/hypervisor/internal/guestfile"
	"wb/internal/probe"
	"wb/internal/proc"
)

// Name is the driver's name (hypervisor.Driver.Name).
const Name = "cloudhv"

// Files of a guest's directory, Options.StateDir/<id>.
const (
	recordFile   = "guest.json"
	apiSocket    = "api.sock"
	vsockSocket  = "vsock.sock"
	eventsFile   = "events"      // the VMM's events, copied from eventsPipeFile (console.go)
	vmmLogFile   = "vmm.log"     // and vmm.log.1: the VMM's stdout and stderr, copied from vmmPipeFile (console.go)
	consoleFile  = "console.log" // and console.log.1 (console.go)
	writableDisk = "writable.img"
	restoreDir   = "restore"
)

// consoleMode is CH's console mode for every guest: a pseudo-terminal (console.go).
const consoleMode = "Pty"

// maxUnixPath is the longest Unix socket path Linux takes (sun_path less its NUL).
const maxUnixPath = 107

// Options configure a Driver.
type Options struct {
	// Binary is the cloud-hypervisor executable (wb node --ch-binary). Required.
	Binary string
	// Kernel is the guest kernel (a bzImage or vmlinux; wb image build's vmlinuz) and
	// Initramfs its initramfs (optional; Debian's cloud kernel needs one for virtio).
	Kernel, Initramfs string
	// StateDir holds one directory per guest (its sockets, event log, writable disk, record).
	// Required; it belongs to this driver alone: List reports every guest found there.
	StateDir string
	// CacheDir holds the rootfs images (template + wb), shared by guests. Default:
	// StateDir/../cloudhv-cache.
	CacheDir string
	// CgroupParent is the cgroup under which each VMM gets <CgroupParent>/<id>. Default: /wb-cloudhv.
	CgroupParent string
	// Env is added to each VMM's environment (the node's own is inherited).
	Env []string
	// EventInterval is how often Events looks at the event log and the VMM. Default: 50ms.
	EventInterval time.Duration
	// StopGrace bounds Stop's vmm.shutdown before the VMM is SIGKILLed. Default: 10s.
	StopGrace time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// mountinfo and cgroupProbe are overridable for tests.
	mountinfo, cgroupProbe string
}

// Driver is a hypervisor.Driver that runs each guest in its own Cloud Hypervisor process.
type Driver struct {
	o        Options
	cg       cgroups
	log      *slog.Logger
	nsPrefix string   // of this driver's network namespaces (netnsPrefix)
	exited   sync.Map // pid → exitInfo, for VMMs this process started (and reaps)
	relays   sync.Map // guest id → *guestRelay this process serves
	copies   sync.Map // copyKey → *logCopy: a console, VMM log or event log this process copies
	// copyRate and copyBurst bound each of those copies (0: no bound); New sets
	// logBytesPerSec and logBurst.
	copyRate  rate.Limit
	copyBurst int
	// images is RootImages' last good listing of the cache dir, which a listing that fails
	// answers; imagesFailing, that the failure was logged (once a run of them). imagesMu
	// holds them and the listing.
	imagesMu      sync.Mutex
	images        []string
	imagesFailing bool
}

var (
	_ hypervisor.Driver        = (*Driver)(nil)
	_ hypervisor.AgentDialer   = (*Driver)(nil)
	_ hypervisor.Resizer       = (*Driver)(nil)
	_ hypervisor.EgressRelayer = (*Driver)(nil)
	_ hypervisor.RootImager    = (*Driver)(nil)
)

// exitInfo is how a VMM this process started ended.
type exitInfo struct {
	status string
	done   chan struct{}
}

// New checks the binary and the kernel and prepares the state dir.
func New(ctx context.Context, o Options) (*Driver, error) {
	if o.Binary == "" {
		return nil, errors.New("cloudhv: no cloud-hypervisor binary given: pass --ch-binary PATH")
	}
	bin, err := exec.LookPath(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("cloudhv: --ch-binary %s: not an executable file: %w", o.Binary, err)
	}
	o.Binary, err = filepath.Abs(bin)
	if err != nil {
		return nil, fmt.Errorf("cloudhv: --ch-binary %s: %w", bin, err)
	}
	if o.Kernel == "" {
		return nil, errors.New("cloudhv: no guest kernel given: pass --kernel PATH (wb image build writes one)")
	}
	for flag, p := range map[string]*string{"--kernel": &o.Kernel, "--initramfs": &o.Initramfs} {
		if *p == "" {
			continue
		}
		fi, err := os.Stat(*p)
		if err == nil && !fi.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
		if err != nil {
			return nil, fmt.Errorf("cloudhv: %s %s: %w", flag, *p, err)
		}
		if *p, err = filepath.Abs(*p); err != nil {
			return nil, fmt.Errorf("cloudhv: %s: %w", flag, err)
		}
	}
	if o.StateDir == "" || !filepath.IsAbs(o.StateDir) {
		return nil, fmt.Errorf("cloudhv: Options.StateDir must be an absolute directory of this driver alone, got %q", o.StateDir)
	}
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(filepath.Dir(filepath.Clean(o.StateDir)), "cloudhv-cache")
	}
	if o.CgroupParent == "" {
		o.CgroupParent = "/wb-cloudhv"
	}
	if !filepath.IsAbs(o.CgroupParent) {
		return nil, fmt.Errorf("cloudhv: Options.CgroupParent must be absolute, got %q", o.CgroupParent)
	}
	o.CgroupParent = filepath.Clean(o.CgroupParent)
	if o.EventInterval <= 0 {
		o.EventInterval = 50 * time.Millisecond
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.mountinfo == "" {
		o.mountinfo = "/proc/self/mountinfo"
	}
	if o.cgroupProbe == "" {
		o.cgroupProbe = "/sys/fs/cgroup/cgroup.controllers"
	}
	cg, err := detectCgroups(o.mountinfo, o.cgroupProbe)
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("cloudhv: each guest's network is set up with ip (iproute2), which is not on PATH: %w", err)
	}
	for _, d := range []string{o.StateDir, o.CacheDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("cloudhv: %w", err)
		}
	}
	d := &Driver{o: o, cg: cg, log: o.Logger.With("driver", Name), nsPrefix: netnsPrefix(o.StateDir),
		copyRate: logBytesPerSec, copyBurst: logBurst}
	// An earlier driver staged restores in the state dir itself: what a crash left there goes.
	if staged, err := filepath.Glob(filepath.Join(o.StateDir, ".restore-*")); err == nil {
		for _, p := range staged {
			_ = os.RemoveAll(p)
		}
	}
	// A restarted node's guests keep their namespaces and taps, but their relays died with
	// the previous process; so did the copies of their consoles, VMM logs and events.
	if err := d.adoptNetworks(ctx); err != nil {
		d.log.Warn("guest networks after a restart", "err", err)
	}
	d.adoptLogs(ctx)
	return d, nil
}

// Name is "cloudhv".
func (d *Driver) Name() string { return Name }

// MemorySnapshots is true: a VM's snapshot always holds its memory.
func (d *Driver) MemorySnapshots() bool { return true }

// GuestDir is guest id's directory.
func (d *Driver) GuestDir(id string) string { return filepath.Join(d.o.StateDir, id) }

// CgroupPath is the cgroup of guest id's VMM.
func (d *Driver) CgroupPath(id string) string { return d.o.CgroupParent + "/" + id }

// RemoveCgroupParent removes the (empty) CgroupParent, e.g. after tests.
func (d *Driver) RemoveCgroupParent() error { return d.cg.remove(d.o.CgroupParent) }

// record is what the driver keeps of a guest in its directory, so that a restarted node's
// driver finds its VMM again.
type record struct {
	Spec      hypervisor.Spec `json:"spec"`
	Pid       int             `json:"pid"`
	Start     string          `json:"start"` // the VMM's start time (/proc/<pid>/stat field 22): a reused pid is not it
	RootFS    string          `json:"rootfs_image"`
	CreatedAt time.Time       `json:"created_at"`
}

func (d *Driver) load(id string) (record, error) {
	var r record
	err := guestfile.ReadGuest("cloudhv", id, filepath.Join(d.GuestDir(id), recordFile), &r)
	return r, err
}

func writeJSON(path string, v any) error {
	if err := guestfile.WriteJSON(path, v); err != nil {
		return fmt.Errorf("cloudhv: %w", err)
	}
	return nil
}

func (d *Driver) client(id string) *chapi.Client {
	return chapi.New(filepath.Join(d.GuestDir(id), apiSocket))
}

// alive reports whether r's VMM still runs.
func (r record) alive() bool { return r.Pid > 0 && proc.Alive(r.Pid, r.Start) }

// List returns the ids of the guests in the state dir.
func (d *Driver) List(context.Context) ([]string, error) {
	ents, err := os.ReadDir(d.o.StateDir)
	if err != nil {
		return nil, fmt.Errorf("cloudhv: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if !e.IsDir() || !hypervisor.ValidID(e.Name()) {
			continue
		}
		if _, err := os.Stat(filepath.Join(d.GuestDir(e.Name()), recordFile)); err == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Create makes the guest's disks, starts its VMM and creates the VM (not booted).
func (d *Driver) Create(ctx context.Context, s hypervisor.Spec) error {
	return d.create(ctx, s, "", nil)
}

// create is Create; with disk the writable disk is a copy of that file (a disk-only
// restore), and with from the VM is restored from that memory snapshot instead of created.
func (d *Driver) create(ctx context.Context, s hypervisor.Spec, disk string, from *memoryRestore) (err error) {
	t0 := time.Now()
	if err := s.Validate(); err != nil {
		return err
	}
	if s.AgentBin == "" {
		return errors.New("cloudhv: Spec.AgentBin is required: the VM's root disk carries the static wb binary as init")
	}
	cmdline, err := kernelCmdline(s)
	if err != nil {
		return err
	}
	if len(s.ReadOnlyBinds) > 0 {
		d.log.Warn("a VM cannot share host directories: the template's read-only binds are left out", "id", s.ID, "binds", len(s.ReadOnlyBinds))
	}
	dir := d.GuestDir(s.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cloudhv: guest %s already exists", s.ID)
		}
		return fmt.Errorf("cloudhv: guest dir: %w", err)
	}
	defer func() {
		if err != nil {
			d.cleanupFailed(s.ID)
		}
	}()
	// The node keeps its own sockets for the guest there (egress).
	if err := os.MkdirAll(s.AgentDir, 0o755); err != nil {
		return fmt.Errorf("cloudhv: agent dir: %w", err)
	}
	var rootfs string
	if from != nil {
		rootfs = from.rootfs // the image the snapshot's guest ran on (snapshotRootFS)
	} else if rootfs, err = image.RootFSImage(ctx, d.o.CacheDir, s.RootFS, s.AgentBin); err != nil {
		return fmt.Errorf("cloudhv: guest %s: rootfs disk: %w", s.ID, err)
	}
	wpath := filepath.Join(dir, writableDisk)
	switch {
	case disk != "":
		err = copySparse(disk, wpath)
	default:
		err = makeWritable(ctx, s, wpath)
	}
	if err != nil {
		return fmt.Errorf("cloudhv: guest %s: writable disk: %w", s.ID, err)
	}
	rec := record{Spec: s, RootFS: rootfs, CreatedAt: time.Now().UTC()}
	if err := writeJSON(filepath.Join(dir, recordFile), rec); err != nil {
		return err
	}
	// A namespace of this name is a leftover of an earlier guest of this id whose delete did
	// not finish: this guest gets a clean one.
	ns := d.NetNamespace(s.ID)
	if err := removeGuestNet(ctx, ns); err != nil {
		return err
	}
	if err := setupGuestNet(ctx, ns); err != nil {
		return err
	}
	if rec, err = d.startVMM(ctx, rec); err != nil {
		return err
	}
	if err := d.startRelay(rec); err != nil {
		return err
	}
	c := d.client(s.ID)
	if from != nil {
		// CH restores the VM exactly as config.json describes it, paths included
		// (RestoreConfig can only swap net fds): the copy it gets names this guest's files.
		// It is staged in the guest's dir, which Delete removes should anything stop here.
		staged := filepath.Join(dir, restoreDir)
		if err := d.stageRestore(from, staged, s); err != nil {
			return err
		}
		if err := c.RestoreVM(ctx, chapi.RestoreConfig{SourceURL: "file://" + staged, Resume: true}); err != nil {
			return d.withLog(s.ID, fmt.Errorf("cloudhv: guest %s: vm.restore: %w", s.ID, err))
		}
		// Read by now: CH holds the memory it restored, not its file.
		if err := os.RemoveAll(staged); err != nil {
			d.log.Warn("remove a restore's staged snapshot", "id", s.ID, "err", err)
		}
		if err := d.startConsole(ctx, s.ID); err != nil {
			d.log.Warn("guest console", "id", s.ID, "err", err)
		}
		d.log.Debug("guest restored", "id", s.ID, "took", time.Since(t0))
		return nil
	}
	if err := c.CreateVM(ctx, d.vmConfig(rec, cmdline)); err != nil {
		return d.withLog(s.ID, fmt.Errorf("cloudhv: guest %s: vm.create: %w", s.ID, err))
	}
	d.log.Debug("guest created", "id", s.ID, "took", time.Since(t0))
	return nil
}

// vmConfig is the VmConfig of guest r (see the shared contract in doc.go).
func (d *Driver) vmConfig(r record, cmdline string) chapi.VmConfig {
	s, dir := r.Spec, d.GuestDir(r.Spec.ID)
	vcpus := max(s.VCPU, 1)
	mem := int64(max(s.MemoryMiB, 0)) << 20
	if mem == 0 {
		mem = defaultMemoryMiB << 20
	}
	return chapi.VmConfig{
		// Room to grow (Resize): vCPUs up to the host's, memory to hotplugFactor times the boot
		// size (ACPI hotplug; the reserved range costs address space, not memory).
		Cpus:    &chapi.CpusConfig{BootVcpus: vcpus, MaxVcpus: max(vcpus, runtime.NumCPU())},
		Memory:  &chapi.MemoryConfig{Size: mem, HotplugSize: (hotplugFactor - 1) * mem},
		Payload: chapi.PayloadConfig{Kernel: d.o.Kernel, Initramfs: d.o.Initramfs, Cmdline: cmdline},
		Disks: []chapi.DiskConfig{
			{ID: "rootfs", Path: r.RootFS, Readonly: true, ImageType: "Raw"},
			{ID: "writable", Path: filepath.Join(dir, writableDisk), ImageType: "Raw"},
		},
		Net:     []chapi.NetConfig{netConfig(s.ID)},
		Vsock:   &chapi.VsockConfig{Cid: guestCID, Socket: filepath.Join(dir, vsockSocket)},
		Console: &chapi.ConsoleConfig{Mode: consoleMode}, // read into console.log (startConsole)
		Serial:  &chapi.ConsoleConfig{Mode: "Null"},
		// A guest kernel's panic becomes a guest/panic event (an exit, see Events).
		Pvpanic: true,
	}
}

const (
	// guestCID is every guest's vsock context id: with hybrid vsock each VMM has its own
	// Unix socket, so CIDs need not differ between guests.
	guestCID         = 3
	defaultMemoryMiB = 512
	// hotplugFactor is how many times its boot memory a VM can grow to (Resize).
	hotplugFactor = 4
	// hotplugStep is CH's ACPI memory hotplug granularity: a DIMM is a multiple of 128 MiB.
	hotplugStepMiB = 128
	defaultDiskGiB = 1
)

// makeWritable makes the guest's writable disk of DiskGiB (1 GiB when 0).
func makeWritable(ctx context.Context, s hypervisor.Spec, path string) error {
	size := int64(s.DiskGiB)
	if size == 0 {
		size = defaultDiskGiB
	}
	// The node never fills Spec.Writable before Create (files reach a guest through its
	// agent), so there is nothing to carry over; a layer that does hold files is refused
	// rather than silently dropped.
	if ents, err := os.ReadDir(s.Writable); err == nil && len(ents) > 0 {
		return fmt.Errorf("Spec.Writable %s already holds files; a VM's writable layer is a disk image made empty, so they would be lost: give an empty or missing dir", s.Writable)
	}
	return image.WritableDisk(ctx, path, size<<30)
}

// startVMM starts the guest's cloud-hypervisor in its own session (so it outlives the node:
// a restarted node finds it through the record) and in the guest's network namespace (where
// it opens the tap), puts it in its own cgroup and waits for its API.
func (d *Driver) startVMM(ctx context.Context, r record) (record, error) {
	id, dir := r.Spec.ID, d.GuestDir(r.Spec.ID)
	for _, p := range []string{filepath.Join(dir, vsockSocket), filepath.Join(dir, apiSocket)} {
		if len(p) > maxUnixPath {
			return r, fmt.Errorf("cloudhv: guest %s: socket %s is longer than Linux's %d bytes: use a shorter state dir", id, p, maxUnixPath)
		}
	}
	// The event log exists before the VMM does, so Events can open it at once.
	if err := os.WriteFile(filepath.Join(dir, eventsFile), nil, 0o600); err != nil {
		return r, fmt.Errorf("cloudhv: event log: %w", err)
	}
	pipes, err := d.openPipes(id)
	if err != nil {
		return r, err
	}
	logw, eventsw := pipes[0], pipes[1]
	defer logw.Close()
	defer eventsw.Close()
	if err := d.cg.create(d.CgroupPath(id)); err != nil {
		return r, err
	}
	cmd := exec.Command(d.o.Binary,
		"--api-socket", "path="+filepath.Join(dir, apiSocket),
		"--event-monitor", "fd=3")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), d.o.Env...)
	cmd.Stdout, cmd.Stderr = logw, logw
	cmd.ExtraFiles = []*os.File{eventsw}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := startInNetns(d.NetNamespace(id), cmd); err != nil {
		return r, fmt.Errorf("cloudhv: start %s: %w", d.o.Binary, err)
	}
	// Passing the write ends made them blocking (os.File.Fd); the VMM's copies are the same
	// open files, which must not be (console.go; CH makes its event monitor's so itself).
	// Once this process's are closed, the VMM's end is the pipes'.
	var perr error
	for _, w := range pipes {
		perr = errors.Join(perr, unix.SetNonblock(int(w.Fd()), true), w.Close())
	}
	if perr != nil {
		_ = cmd.Process.Kill()
		return r, fmt.Errorf("cloudhv: the VMM's pipes: %w", perr)
	}
	ex := &exitInfo{done: make(chan struct{})}
	d.exited.Store(cmd.Process.Pid, ex)
	go func() {
		err := cmd.Wait()
		ex.status = "exit status 0"
		if err != nil {
			ex.status = err.Error()
		}
		close(ex.done)
	}()
	r.Pid = cmd.Process.Pid
	r.Start, _ = proc.Start(r.Pid)
	if err := writeJSON(filepath.Join(dir, recordFile), r); err != nil {
		_ = cmd.Process.Kill()
		return r, err
	}
	// Before the VM exists: whatever the VMM starts (vCPU threads, a fake's guest) is
	// accounted to it.
	if err := d.cg.add(d.CgroupPath(id), r.Pid); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			<-ex.done
			d.awaitVMMLog(id)
			return r, d.withLog(id, fmt.Errorf("cloudhv: guest %s: %s exited at once (%s)", id, d.o.Binary, ex.status))
		}
		_ = cmd.Process.Kill()
		return r, err
	}
	if err := d.waitAPI(ctx, r, ex.done); err != nil {
		select {
		case <-ex.done:
			d.awaitVMMLog(id)
		default:
		}
		return r, d.withLog(id, err)
	}
	return r, nil
}

// waitAPI waits until the VMM answers vmm.ping, or fails when it exits first; a ping's
// bound grows as node's agent probes' do (internal/probe).
func (d *Driver) waitAPI(ctx context.Context, r record, exited <-chan struct{}) error {
	c := d.client(r.Spec.ID)
	err := probe.Default().Until(ctx, exited, func(ctx context.Context) error {
		_, err := c.Ping(ctx)
		return err
	})
	switch {
	case errors.Is(err, probe.ErrGone):
		return fmt.Errorf("cloudhv: guest %s: %s exited before its API answered", r.Spec.ID, d.o.Binary)
	case err != nil:
		return fmt.Errorf("cloudhv: guest %s: the VMM's API did not answer: %w", r.Spec.ID, err)
	}
	return nil
}

// withLog adds the tail of the guest's VMM log to err.
func (d *Driver) withLog(id string, err error) error {
	if t := tail(filepath.Join(d.GuestDir(id), vmmLogFile), 2048); t != "" {
		return fmt.Errorf("%w; VMM log: %s", err, t)
	}
	return err
}

// tail is the last n bytes of file path, trimmed.
func tail(path string, n int64) string { return strings.TrimSpace(string(tailBytes(path, n))) }

// tailBytes is the last n bytes of file path (none when it cannot be read).
func tailBytes(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(fi.Size()-n, 0)
	b, _ := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	return b
}

func (d *Driver) cleanupFailed(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), d.o.StopGrace+20*time.Second)
	defer cancel()
	if err := d.Delete(ctx, id); err != nil {
		d.log.Warn("cleanup after a failed create", "id", id, "err", err)
	}
}

// running loads guest id and checks that its VMM runs.
func (d *Driver) running(id string) (record, error) {
	r, err := d.load(id)
	if err != nil {
		return r, err
	}
	if !r.alive() {
		return r, fmt.Errorf("cloudhv: guest %s is stopped (its VMM exited)", id)
	}
	return r, nil
}

// Boot boots the created VM (vm.boot).
func (d *Driver) Boot(ctx context.Context, id string) error {
	if _, err := d.running(id); err != nil {
		return err
	}
	if err := d.client(id).BootVM(ctx); err != nil {
		return d.withLog(id, fmt.Errorf("cloudhv: guest %s: vm.boot: %w", id, err))
	}
	// Without its copy the guest runs as well; its console's last 16 KiB stay in the VMM.
	if err := d.startConsole(ctx, id); err != nil {
		d.log.Warn("guest console", "id", id, "err", err)
	}
	return nil
}

// Pause pauses the VM's vCPUs and devices (vm.pause).
func (d *Driver) Pause(ctx context.Context, id string) error {
	if _, err := d.running(id); err != nil {
		return err
	}
	if err := d.client(id).PauseVM(ctx); err != nil {
		return fmt.Errorf("cloudhv: guest %s: %w", id, err)
	}
	return nil
}

// Resume resumes the paused VM (vm.resume).
func (d *Driver) Resume(ctx context.Context, id string) error {
	if _, err := d.running(id); err != nil {
		return err
	}
	if err := d.client(id).ResumeVM(ctx); err != nil {
		return fmt.Errorf("cloudhv: guest %s: %w", id, err)
	}
	return nil
}

// Resize changes the running VM's vCPUs and memory (vm.resize); 0 leaves one as it is. vCPUs
// go from 1 to the VM's max_vcpus (the host's CPUs). Memory only grows (CH's ACPI hotplug
// cannot take memory back, and would answer a shrink with success while changing nothing), in
// steps of 128 MiB, up to the VM's boot size plus its hotplug_size.
func (d *Driver) Resize(ctx context.Context, id string, vcpu, memoryMiB int) error {
	if vcpu < 0 || memoryMiB < 0 {
		return fmt.Errorf("cloudhv: resize %s: vcpu %d and memory_mib %d must not be negative (0 keeps the current value)", id, vcpu, memoryMiB)
	}
	r, err := d.running(id)
	if err != nil {
		return err
	}
	c := d.client(id)
	vi, err := c.VMInfo(ctx)
	if err != nil {
		return fmt.Errorf("cloudhv: resize %s: %w", id, err)
	}
	req := chapi.VmResize{DesiredVcpus: vcpu, DesiredRam: int64(memoryMiB) << 20}
	if cpus := vi.Config.Cpus; vcpu > 0 && cpus != nil && vcpu > cpus.MaxVcpus {
		return fmt.Errorf("cloudhv: resize %s: vcpu %d is more than the VM's max_vcpus %d: give at most %d", id, vcpu, cpus.MaxVcpus, cpus.MaxVcpus)
	}
	if m := vi.Config.Memory; memoryMiB > 0 && m != nil {
		cur := int(m.Size >> 20)
		// The hotplug range starts at the boot size (vm.resize moves memory.size, not it).
		boot := r.Spec.MemoryMiB
		if boot == 0 {
			boot = defaultMemoryMiB
		}
		switch top := boot + int(m.HotplugSize>>20); {
		case memoryMiB < cur:
			return fmt.Errorf("cloudhv: resize %s: memory_mib %d is less than the VM's %d MiB: a VM's memory only grows (ACPI hotplug)", id, memoryMiB, cur)
		case memoryMiB == cur:
			req.DesiredRam = 0
		case (memoryMiB-cur)%hotplugStepMiB != 0:
			return fmt.Errorf("cloudhv: resize %s: memory_mib %d grows the VM's %d MiB by %d MiB: it grows in steps of %d MiB", id, memoryMiB, cur, memoryMiB-cur, hotplugStepMiB)
		case memoryMiB > top:
			return fmt.Errorf("cloudhv: resize %s: memory_mib %d is more than the VM can grow to (%d MiB)", id, memoryMiB, top)
		}
	}
	if req == (chapi.VmResize{}) {
		return nil
	}
	if err := c.ResizeVM(ctx, req); err != nil {
		return fmt.Errorf("cloudhv: resize %s: %w", id, err)
	}
	return nil
}

// Stop kills the guest: vmm.shutdown, which stops the vCPUs at once (the guest is not asked)
// and ends the VMM; a VMM that has not exited within StopGrace, or does not answer, is
// SIGKILLed with everything left in its cgroup. It returns once the VMM is gone.
func (d *Driver) Stop(ctx context.Context, id string) error {
	r, err := d.load(id)
	if err != nil {
		return err
	}
	defer d.stopRelay(ctx, id)
	if !r.alive() {
		// A VMM this process started may still be a zombie, whose cgroup cannot go yet.
		d.waitGone(ctx, r)
		d.cg.killAll(d.CgroupPath(id))
		return nil
	}
	gctx, cancel := context.WithTimeout(ctx, d.o.StopGrace)
	defer cancel()
	if err := d.client(id).ShutdownVMM(gctx); err != nil {
		d.log.Warn("vmm.shutdown failed; killing the VMM", "id", id, "err", err)
	} else if d.waitGone(gctx, r) {
		d.cg.killAll(d.CgroupPath(id))
		return nil
	}
	if r.alive() {
		_ = syscall.Kill(-r.Pid, syscall.SIGKILL) // its session's process group
		_ = syscall.Kill(r.Pid, syscall.SIGKILL)
	}
	d.cg.killAll(d.CgroupPath(id))
	kctx, kcancel := context.WithTimeout(ctx, 10*time.Second)
	defer kcancel()
	if !d.waitGone(kctx, r) {
		return fmt.Errorf("cloudhv: stop %s: VMM pid %d still runs 10s after SIGKILL", id, r.Pid)
	}
	return nil
}

// waitGone waits until r's VMM has exited (and, when this process started it, is reaped).
func (d *Driver) waitGone(ctx context.Context, r record) bool {
	var done <-chan struct{}
	if v, ok := d.exited.Load(r.Pid); ok {
		done = v.(*exitInfo).done
	}
	for {
		if done != nil {
			select {
			case <-done:
				return true
			default:
			}
		} else if !r.alive() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-done:
			return true
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Delete stops the guest and removes its cgroup, its network namespace (with the tap) and
// its directory. An unknown guest is not an error.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if !hypervisor.ValidID(id) {
		return fmt.Errorf("cloudhv: invalid guest id %q", id)
	}
	dir := d.GuestDir(id)
	var errs []error
	r, err := d.load(id)
	switch {
	case err == nil:
		if err := d.Stop(ctx, id); err != nil {
			errs = append(errs, err)
		}
	case !errors.Is(err, hypervisor.ErrNotFound):
		// A record that cannot be read does not name the VMM, which may still run: it is
		// ended before its files go.
		if kerr := d.endUnrecorded(ctx, id); kerr != nil {
			errs = append(errs, fmt.Errorf("%w (%w)", kerr, err))
		}
	}
	if err := d.cg.remove(d.CgroupPath(id)); err != nil {
		d.log.Debug("remove cgroup", "id", id, "err", err)
	}
	d.stopRelay(ctx, id)
	d.stopCopies(id)
	if len(errs) == 0 {
		// Once the VMM is gone: the namespace's name is all that keeps it (and the tap).
		if err := removeGuestNet(ctx, d.NetNamespace(id)); err != nil {
			errs = append(errs, err)
		}
		// Never remove through a mount: a VMM that left one would lose what it holds.
		if m := mountsUnder(dir); len(m) > 0 {
			errs = append(errs, fmt.Errorf("cloudhv: delete %s: %s is still mounted; unmount it first", id, strings.Join(m, ", ")))
		} else if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("cloudhv: remove guest dir: %w", err))
		}
	}
	if v, ok := d.exited.Load(r.Pid); ok && r.Pid > 0 {
		select {
		case <-v.(*exitInfo).done:
			d.exited.Delete(r.Pid)
		default:
		}
	}
	return errors.Join(errs...)
}

// endUnrecorded ends guest id's VMM without its record, which names its pid: vmm.shutdown
// on its API socket, as Stop asks, then SIGKILL for whatever is left in the guest's cgroup
// (the VMM, from its start) until the cgroup is empty, or ctx ends.
func (d *Driver) endUnrecorded(ctx context.Context, id string) error {
	p := d.CgroupPath(id)
	empty := func(ctx context.Context) bool {
		for len(d.cg.pids(p)) > 0 {
			select {
			case <-ctx.Done():
				return false
			case <-time.After(10 * time.Millisecond):
			}
		}
		return true
	}
	gctx, cancel := context.WithTimeout(ctx, d.o.StopGrace)
	defer cancel()
	if err := d.client(id).ShutdownVMM(gctx); err == nil && empty(gctx) {
		return nil
	}
	d.cg.killAll(p)
	kctx, kcancel := context.WithTimeout(ctx, 10*time.Second)
	defer kcancel()
	if !empty(kctx) {
		return fmt.Errorf("cloudhv: delete %s: its cgroup still holds processes 10s after SIGKILL", id)
	}
	return nil
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	dir = filepath.Clean(dir)
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if mp := f[4]; mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// Info reports the guest's state: stopped once its VMM is gone, else vm.info's state.
func (d *Driver) Info(ctx context.Context, id string) (hypervisor.Info, error) {
	r, err := d.load(id)
	if err != nil {
		return hypervisor.Info{}, err
	}
	if !r.alive() {
		return hypervisor.Info{State: hypervisor.StateStopped}, nil
	}
	vi, err := d.client(id).VMInfo(ctx)
	if err != nil {
		if chapi.IsNotCreated(err) {
			return hypervisor.Info{State: hypervisor.StateStopped}, nil
		}
		// A VMM closes its API socket only on its way out, after vmm.shutdown has stopped
		// the vCPUs: one still exiting (or gone meanwhile) runs no guest.
		if !r.alive() || apiClosed(err) {
			return hypervisor.Info{State: hypervisor.StateStopped}, nil
		}
		return hypervisor.Info{}, fmt.Errorf("cloudhv: guest %s: %w", id, err)
	}
	var st hypervisor.State
	switch vi.State {
	case chapi.VmStateCreated:
		st = hypervisor.StateCreated
	case chapi.VmStateRunning:
		st = hypervisor.StateRunning
	case chapi.VmStatePaused, chapi.VmStateBreakPoint:
		st = hypervisor.StatePaused
	case chapi.VmStateShutdown:
		return hypervisor.Info{State: hypervisor.StateStopped}, nil
	default:
		return hypervisor.Info{}, fmt.Errorf("cloudhv: guest %s: vm.info state %q is not one of cloud-hypervisor's", id, vi.State)
	}
	return hypervisor.Info{State: st, Pid: r.Pid}, nil
}

// apiClosed: nothing listens on the API socket any more (removed, or left without a listener).
// A VMM that hangs still listens: its calls time out instead.
func apiClosed(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// KnownRunning never knows: a VM's agent can die while its VMM runs on (the guest kernel's
// panic is an event, not the VMM's end), so only a probe of the agent tells.
func (d *Driver) KnownRunning(string) (running, known bool) { return false, false }

// Stats reads the VMM's cgroup (CPU, memory and OOM kills of everything the VMM runs) and
// the VM's network counters (vm.counters' rx_bytes and tx_bytes of its virtio-net devices).
func (d *Driver) Stats(ctx context.Context, id string) (hypervisor.Stats, error) {
	r, err := d.load(id)
	if err != nil {
		return hypervisor.Stats{}, err
	}
	var out hypervisor.Stats
	cpu, mem, ooms, err := d.cg.counters(d.CgroupPath(id))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return out, fmt.Errorf("cloudhv: stats %s: %w", id, err)
	}
	out.CPUMs, out.MemoryBytes, out.OOMKills = cpu/1e6, mem, ooms
	if r.alive() {
		// Only a booted VM has counters (else 500 "VM is not running"): none is 0 bytes.
		if c, err := d.client(id).VMCounters(ctx); err == nil {
			out.NetRxBytes, out.NetTxBytes = netBytes(c)
		}
	}
	return out, nil
}

// netBytes sums the byte counters of the VM's net devices (CH's virtio-net counters: rx_bytes,
// tx_bytes, rx_frames, tx_frames; disks count read_bytes and write_bytes).
func netBytes(c chapi.VmCounters) (rx, tx int64) {
	for _, dev := range c {
		if _, isNet := dev["tx_frames"]; !isNet {
			continue
		}
		rx += int64(dev["rx_bytes"])
		tx += int64(dev["tx_bytes"])
	}
	return rx, tx
}
