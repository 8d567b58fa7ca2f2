package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"wb/hypervisor"
	"wb/hypervisor/internal/guestfile"
	"wb/internal/proc"
)

// Runtime names.
const (
	RuntimeRunsc = "runsc"
	RuntimeRunc  = "runc"
)

// Options configure a Driver.
type Options struct {
	// Runtime is "runsc", "runc" or "" (runsc when on PATH, else runc).
	Runtime string
	// RuntimePath is the runtime binary; default: looked up on PATH by Runtime's name.
	RuntimePath string
	// StateRoot is the runtime's --root (its state dir) and BundleRoot holds one bundle dir
	// per guest. Both are required and belong to one driver: a driver lists (and its node
	// reaps) every guest it finds there. wb puts them in its data dir, which it locks.
	StateRoot  string
	BundleRoot string
	// DiskTemplates holds the empty file systems guests' disk images are copied from
	// (newDiskImage); best on the file system of the images. Default: BundleRoot/_disks.
	DiskTemplates string
	// CgroupParent is the cgroup under which each guest gets <CgroupParent>/<id>. Default: /wb.
	CgroupParent string
	// GuestsCgroup is the cgroup every guest on the host is under: CgroupParent or an
	// ancestor of it (wb: /wb, above each node's /wb/<node>). New caps its pids.max so that
	// the guests together leave the host process ids to spare (capGuestsPids). Default:
	// CgroupParent.
	GuestsCgroup string
	// RunscFlags replace the default global runsc flags (DefaultRunscFlags).
	RunscFlags []string
	// EventInterval is the polling period of Events. Default: 200ms.
	EventInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// AllowUnlimitedDisk lets a guest with a disk limit start without one when the host
	// cannot make its ext4 loop image (the operator's --allow-unlimited-disk); by default
	// such a guest does not start.
	AllowUnlimitedDisk bool

	// cgroupProbe and mountinfo are overridable for tests of the cgroup detection.
	cgroupProbe, mountinfo string
	// pidMaxFile and threadsMaxFile (/proc/sys/kernel/pid_max and threads-max) are
	// overridable for tests of the guests' process total.
	pidMaxFile, threadsMaxFile string
}

// DefaultRunscFlags are the global flags runsc needs on the hosts we know: the ptrace platform
// (KVM hangs on PVM hosts), no network stack (gVisor's netstack refuses to run in the root
// netns here, and guests get loopback only), host Unix sockets allowed in bind mounts (the
// agent's socket), no overlay on the root (it is read-only anyway; writes go to binds), and the
// spec's seccomp profile applied inside the sandbox too.
func DefaultRunscFlags() []string {
	return []string{"--platform=ptrace", "--network=none", "--host-uds=all", "--overlay2=none", "--oci-seccomp"}
}

// Driver is a hypervisor.Driver backed by an OCI runtime.
type Driver struct {
	name          string
	rt            *gorunc.Runc
	bundleRoot    string
	diskTemplates string
	runDir        string // the tmpfs of its state and bundles (OpenDataDir), or ""
	cgroupParent  string
	guestsCgroup  string // Options.GuestsCgroup
	guestsMax     guestsMax
	cg            cgroupHost
	eventInterval time.Duration
	log           *slog.Logger
	diskOnce      sync.Once
	diskMu        sync.Mutex // held while a disk template is made (diskTemplate)
	seccomp       *specs.LinuxSeccomp
	unlimitedDisk bool
	// directCheckpoint: this runsc is a build whose sandbox's checkpoint call
	// checkpointSandbox speaks (runscBuildKnown).
	directCheckpoint bool
	// consoleFault, set by tests alone, fails each open of a guest's console log.
	consoleFault error

	initMu sync.Mutex
	inits  map[string]initProc // guest id → its process as this driver's create found it
}

// initProc is a guest's process as the runtime's create wrote it to its pid file (runc: the
// container's init; runsc: the sandbox), with its start time, which tells it from a later
// process with the same pid, and the state this driver last put the guest in (created,
// running or paused) while that process lives.
type initProc struct {
	pid   int
	start string
	state hypervisor.State
}

var _ hypervisor.Driver = (*Driver)(nil)

// New returns a Driver after checking that the runtime binary exists.
func New(o Options) (*Driver, error) {
	name := o.Runtime
	if name == "" {
		name = RuntimeRunc
		if _, err := exec.LookPath(RuntimeRunsc); err == nil {
			name = RuntimeRunsc
		}
	}
	if name != RuntimeRunsc && name != RuntimeRunc {
		return nil, fmt.Errorf("oci: unknown runtime %q (want runsc or runc)", name)
	}
	bin := o.RuntimePath
	if bin == "" {
		p, err := exec.LookPath(name)
		if err != nil {
			return nil, fmt.Errorf("oci: %s not found on PATH (Debian: apt-get install %s): %w", name, name, err)
		}
		bin = p
	}
	if o.StateRoot == "" || o.BundleRoot == "" {
		return nil, errors.New("oci: Options.StateRoot and Options.BundleRoot are required: give each driver its own (wb: OpenDataDir's layouts in its data dir), since a driver takes every guest it finds there for its own")
	}
	if o.CgroupParent == "" {
		o.CgroupParent = "/wb"
	}
	if o.DiskTemplates == "" {
		o.DiskTemplates = filepath.Join(o.BundleRoot, diskTemplates)
	}
	if !filepath.IsAbs(o.StateRoot) || !filepath.IsAbs(o.BundleRoot) || !filepath.IsAbs(o.CgroupParent) {
		return nil, errors.New("oci: StateRoot, BundleRoot and CgroupParent must be absolute")
	}
	if o.GuestsCgroup == "" {
		o.GuestsCgroup = o.CgroupParent
	}
	if err := checkGuestsCgroup(o.GuestsCgroup, o.CgroupParent); err != nil {
		return nil, err
	}
	if o.EventInterval <= 0 {
		o.EventInterval = 200 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.cgroupProbe == "" {
		o.cgroupProbe = "/sys/fs/cgroup/cgroup.controllers"
	}
	if o.mountinfo == "" {
		o.mountinfo = "/proc/self/mountinfo"
	}
	if o.pidMaxFile == "" {
		o.pidMaxFile = "/proc/sys/kernel/pid_max"
	}
	if o.threadsMaxFile == "" {
		o.threadsMaxFile = "/proc/sys/kernel/threads-max"
	}
	cg, err := detectCgroups(o.mountinfo, o.cgroupProbe)
	if err != nil {
		return nil, err
	}
	sc, err := defaultSeccomp()
	if err != nil {
		return nil, err
	}
	for _, d := range []string{o.StateRoot, o.BundleRoot} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
	}
	rt := &gorunc.Runc{Command: bin, Root: o.StateRoot}
	if name == RuntimeRunsc {
		rt.ExtraArgs = DefaultRunscFlags()
		if o.RunscFlags != nil {
			rt.ExtraArgs = append([]string(nil), o.RunscFlags...)
		}
	}
	direct := false
	if name == RuntimeRunsc {
		out, err := exec.Command(bin, "--version").Output()
		direct = err == nil && runscBuildKnown(out)
	}
	d := &Driver{
		directCheckpoint: direct,
		name:             name,
		rt:               rt,
		bundleRoot:       o.BundleRoot,
		diskTemplates:    o.DiskTemplates,
		cgroupParent:     filepath.Clean(o.CgroupParent),
		guestsCgroup:     filepath.Clean(o.GuestsCgroup),
		cg:               cg,
		eventInterval:    o.EventInterval,
		log:              o.Logger.With("driver", "oci", "runtime", name),
		seccomp:          sc,
		unlimitedDisk:    o.AllowUnlimitedDisk,
		inits:            map[string]initProc{},
	}
	d.capGuestsPids(o.pidMaxFile, o.threadsMaxFile)
	return d, nil
}

// Name is "runsc" or "runc".
func (d *Driver) Name() string { return d.name }

// MemorySnapshots reports whether Snapshot can save memory: runsc checkpoints, runc cannot
// (it would need CRIU).
func (d *Driver) MemorySnapshots() bool { return d.name == RuntimeRunsc }

// CgroupV2 reports whether the host uses the unified cgroup hierarchy.
func (d *Driver) CgroupV2() bool { return d.cg.v2 }

// CgroupPath is the cgroupsPath of guest id (below each v1 controller's mount, or below the v2 root).
func (d *Driver) CgroupPath(id string) string { return d.cgroupParent + "/" + id }

// RemoveCgroupParent removes the (empty) CgroupParent directories, e.g. at shutdown or after
// tests; it fails harmlessly while guests still exist.
func (d *Driver) RemoveCgroupParent() error { return d.cg.removeDirs(d.cgroupParent) }

// ConsoleLog is the file that receives guest id's init stdout and stderr (and the runtime's
// own errors on create and restore). It lives on a small tmpfs of its own (mountConsole).
func (d *Driver) ConsoleLog(id string) string {
	return filepath.Join(d.BundleDir(id), consoleDir, consoleFile)
}

// BundleDir is guest id's bundle directory.
func (d *Driver) BundleDir(id string) string { return filepath.Join(d.bundleRoot, id) }

// List returns the ids of the containers the runtime knows in this driver's state root.
//
// It runs the runtime's list itself, as go-runc would (its global flags, then list
// --format=json), to keep what the runtime printed on stderr for the error: go-runc's List
// drops it, and a failed list then said only "runsc did not terminate successfully: exit
// status 2", where runsc had said which state file it could not read (its list panics on
// one that is JSON of no container), which is what the operator must remove.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	cmd := exec.CommandContext(ctx, d.rt.Command, append(d.globalArgs(), "list", "--format=json")...)
	var stdout bytes.Buffer
	stderr := &headTailWriter{max: listStderrMax}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	if err := cmd.Run(); err != nil {
		if said := strings.TrimSpace(string(stderr.bytes())); said != "" {
			return nil, fmt.Errorf("oci: %s list: %w: %s", d.name, err, said)
		}
		return nil, fmt.Errorf("oci: %s list: %w", d.name, err)
	}
	var cs []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &cs); err != nil {
		return nil, fmt.Errorf("oci: %s list: its output: %w", d.name, err)
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// listStderrMax bounds what a failed list keeps of the runtime's stderr (its last bytes: a
// Go panic's message comes first, but its goroutine dump after it may be long).
const listStderrMax = 4 << 10

// globalArgs are the runtime's global flags, as go-runc passes them before each command.
func (d *Driver) globalArgs() []string {
	return append([]string{"--root", d.rt.Root}, d.rt.ExtraArgs...)
}

// headTailWriter keeps the first and the last max/2 bytes written to it, " … " between
// them when it dropped some.
type headTailWriter struct {
	max        int
	head, tail []byte
	cut        bool
}

func (w *headTailWriter) Write(p []byte) (int, error) {
	n := len(p)
	if room := w.max/2 - len(w.head); room > 0 {
		k := min(room, len(p))
		w.head, p = append(w.head, p[:k]...), p[k:]
	}
	w.tail = append(w.tail, p...)
	if over := len(w.tail) - w.max/2; over > 0 {
		w.tail, w.cut = append(w.tail[:0], w.tail[over:]...), true
	}
	return n, nil
}

func (w *headTailWriter) bytes() []byte {
	if !w.cut {
		return append(slices.Clip(w.head), w.tail...)
	}
	return append(append(slices.Clip(w.head), " … "...), w.tail...)
}

const (
	configFile  = "config.json"
	guestFile   = "wb-guest.json"
	consoleFile = "console.log"
	consoleDir  = "console" // in the bundle: the console log's tmpfs
	pidFile     = "init.pid"
)

// guestRecord is what the driver keeps about a guest beside its OCI config.
type guestRecord struct {
	Spec        hypervisor.Spec `json:"spec"`
	CgroupsPath string          `json:"cgroups_path"`
	Runtime     string          `json:"runtime"`
}

func (d *Driver) loadGuest(id string) (guestRecord, error) {
	var g guestRecord
	err := guestfile.ReadGuest("oci", id, filepath.Join(d.BundleDir(id), guestFile), &g)
	return g, err
}

// prepare creates the writable dirs and writes the bundle of s.
func (d *Driver) prepare(s hypervisor.Spec) (_ string, err error) {
	if err := s.Validate(); err != nil {
		return "", err
	}
	for _, p := range []string{s.RootFS, s.AgentDir} {
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			if err == nil {
				err = errors.New("not a directory")
			}
			if p == s.AgentDir && errors.Is(err, fs.ErrNotExist) {
				if err := os.MkdirAll(p, 0o755); err != nil {
					return "", fmt.Errorf("oci: agent dir: %w", err)
				}
				continue
			}
			return "", fmt.Errorf("oci: %s: %w", p, err)
		}
	}
	if s.AgentBin != "" {
		if fi, err := os.Stat(s.AgentBin); err != nil || !fi.Mode().IsRegular() {
			return "", fmt.Errorf("oci: agent bin %s: not a regular file (%v)", s.AgentBin, err)
		}
	}
	if err := d.checkReachable(s); err != nil {
		return "", err
	}
	if err := d.layoutWritable(s.Writable); err != nil {
		return "", err
	}
	bundle := d.BundleDir(s.ID)
	if _, err := os.Stat(filepath.Join(bundle, guestFile)); err == nil {
		return "", fmt.Errorf("oci: guest %s already exists", s.ID)
	}
	if err := d.mountAgentDir(s); err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			_ = unmountAgentDir(s)
		}
	}()
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return "", fmt.Errorf("oci: bundle: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(bundle) // after the console's unmount (deferred next): its room comes back
		}
	}()
	if err := mountConsole(bundle); err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			_ = unmountConsole(bundle)
		}
	}()
	rec := guestRecord{Spec: s, CgroupsPath: d.CgroupPath(s.ID), Runtime: d.name}
	cfg := ociSpec(s, specOptions{runsc: d.name == RuntimeRunsc, cgroupsPath: rec.CgroupsPath, swap: d.cg.swap, nofile: guestNofile(), seccomp: d.seccomp})
	if err := writeJSON(filepath.Join(bundle, configFile), cfg); err != nil {
		return "", err
	}
	if err := writeJSON(filepath.Join(bundle, guestFile), rec); err != nil {
		return "", err
	}
	return bundle, nil
}

// layoutWritable makes the dirs of a writable layer at dir (hypervisor.WritableMounts), with
// their modes, owned by guest root where guests have a user namespace. Idempotent.
func (d *Driver) layoutWritable(dir string) error {
	for _, w := range hypervisor.WritableMounts() {
		p := filepath.Join(dir, w.Subdir)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("oci: writable layer: %w", err)
		}
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			return fmt.Errorf("oci: writable layer: %s is not a directory", p)
		}
		if err := os.Chmod(p, fs.FileMode(w.Mode&0o777)|modeBits(w.Mode)); err != nil {
			return fmt.Errorf("oci: writable layer: %w", err)
		}
		if d.userNS() {
			// Owned by guest root, which is an unprivileged host uid.
			if err := os.Lchown(p, guestRootID, guestRootID); err != nil {
				return fmt.Errorf("oci: writable layer: %w", err)
			}
		}
	}
	return nil
}

func modeBits(m uint32) fs.FileMode {
	var out fs.FileMode
	if m&0o1000 != 0 {
		out |= fs.ModeSticky
	}
	return out
}

func writeJSON(path string, v any) error {
	if err := guestfile.WriteJSON(path, v); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	return nil
}

// consoleIO connects the runtime command (and so the guest's init, which inherits it) to
// the bundle's console log; stdin is /dev/null.
type consoleIO struct{ f *os.File }

func (d *Driver) openConsole(bundle string) (*consoleIO, int64, error) {
	path := filepath.Join(bundle, consoleDir, consoleFile)
	if d.consoleFault != nil {
		return nil, 0, fmt.Errorf("open its console log %s: %w", path, d.consoleFault)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("open its console log: %w", err)
	}
	off, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("open its console log: %w", err)
	}
	return &consoleIO{f: f}, off, nil
}

func (c *consoleIO) Close() error           { return c.f.Close() }
func (c *consoleIO) Stdin() io.WriteCloser  { return nil }
func (c *consoleIO) Stdout() io.ReadCloser  { return nil }
func (c *consoleIO) Stderr() io.ReadCloser  { return nil }
func (c *consoleIO) Set(cmd *exec.Cmd)      { cmd.Stdout, cmd.Stderr = c.f, c.f }
func (c *consoleIO) CloseAfterStart() error { return nil }
func (c *consoleIO) String() string         { return c.f.Name() }
func (c *consoleIO) tail(from int64) string { return readTail(c.f.Name(), from) }
func (c *consoleIO) withTail(from int64, err error) error {
	if t := c.tail(from); t != "" {
		return fmt.Errorf("%w: %s", err, t)
	}
	return err
}

// readTail returns what was appended to path since offset from (at most 4 KiB of it).
func readTail(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	if fi.Size()-from > 4096 {
		from = fi.Size() - 4096
	}
	b, err := io.ReadAll(io.NewSectionReader(f, from, fi.Size()-from))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// stdioIO connects the runtime command, and so the guest's init, to a direct guest's
// standard streams (hypervisor.DirectLauncher).
type stdioIO struct{ f [3]*os.File }

func (c *stdioIO) Close() error           { return nil }
func (c *stdioIO) Stdin() io.WriteCloser  { return nil }
func (c *stdioIO) Stdout() io.ReadCloser  { return nil }
func (c *stdioIO) Stderr() io.ReadCloser  { return nil }
func (c *stdioIO) Set(cmd *exec.Cmd)      { cmd.Stdin, cmd.Stdout, cmd.Stderr = c.f[0], c.f[1], c.f[2] }
func (c *stdioIO) CloseAfterStart() error { return nil }

// Create writes the bundle and creates the container (not started).
func (d *Driver) Create(ctx context.Context, s hypervisor.Spec) error {
	return d.create(ctx, s, false, nil)
}

// CanLaunchDirect says whether LaunchDirect can (hypervisor.DirectLauncher): on runsc. A runc
// guest keeps its agent: its agent dir is sealed from guest root once the agent listens
// (sealAgentDir), and a direct guest's, with no agent, could not be.
func (d *Driver) CanLaunchDirect() bool { return d.name == RuntimeRunsc }

// LaunchDirect is Launch for a direct guest (hypervisor.DirectLauncher): the runtime, and so
// the guest's init, gets stdio as its standard streams, in place of the console log and
// /dev/null, and no agent is waited for. A failed start's error has no console lines: the
// runtime wrote them to stdio[2].
func (d *Driver) LaunchDirect(ctx context.Context, s hypervisor.Spec, stdio [3]*os.File) error {
	if !d.CanLaunchDirect() {
		return fmt.Errorf("oci: %s cannot launch a direct guest: %w", d.name, errors.ErrUnsupported)
	}
	if s.AgentSocket != "" {
		return fmt.Errorf("oci: a direct guest has no agent socket, got %q", s.AgentSocket)
	}
	return d.create(ctx, s, true, &stdio)
}

// Launch creates and boots the guest in one runtime call, `run --detach` (hypervisor.Launcher):
// Create then Boot start the runtime twice, `create` and `start`, and each start of runc is
// about 9 ms of CPU here (runsc's more), which a warm pool's refill pays once per run.
func (d *Driver) Launch(ctx context.Context, s hypervisor.Spec) error {
	if err := d.create(ctx, s, true, nil); err != nil {
		return err
	}
	if err := d.sealAgentDir(ctx, s); err != nil {
		d.cleanupFailed(s.ID)
		return err
	}
	return nil
}

// create writes the bundle and creates the container; with run, it starts it too. With
// stdio, the init's standard streams are those, not the console log.
func (d *Driver) create(ctx context.Context, s hypervisor.Spec, run bool, stdio *[3]*os.File) error {
	t0 := time.Now()
	if err := s.Validate(); err != nil {
		return err
	}
	// Before the disk: attachDisk takes a mounted layer for this guest's, and a failure
	// after it lets the disk go, under the guest that has it.
	if _, err := os.Stat(filepath.Join(d.BundleDir(s.ID), guestFile)); err == nil {
		return fmt.Errorf("oci: guest %s already exists", s.ID)
	}
	if err := d.attachDisk(ctx, s); err != nil {
		return err
	}
	bundle, err := d.prepare(s)
	if err != nil {
		_ = detachDisk(s)
		return d.noRoom(s.ID, err)
	}
	// From here a failure deletes what prepare made (its mounts, the bundle, the disk):
	// the guest's record names them, and nothing else would.
	var gio gorunc.IO
	withTail := func(err error) error { return err }
	if stdio != nil {
		gio = &stdioIO{f: *stdio}
	} else {
		con, off, err := d.openConsole(bundle)
		if err != nil {
			d.cleanupFailed(s.ID)
			return fmt.Errorf("oci: guest %s: %w", s.ID, err)
		}
		defer con.Close()
		gio, withTail = con, func(err error) error { return con.withTail(off, err) }
	}
	pf := filepath.Join(bundle, pidFile)
	opts := &gorunc.CreateOpts{IO: gio, PidFile: pf}
	verb, state := "create", hypervisor.StateCreated
	if run {
		verb, state, opts.Detach = "run", hypervisor.StateRunning, true
	}
	err = startsGuest(ctx, d.log, slowStartWarn, d.name+" "+verb, s.ID, func(ctx context.Context) error {
		if run {
			_, err := d.rt.Run(ctx, s.ID, bundle, opts)
			return err
		}
		return d.rt.Create(ctx, s.ID, bundle, opts)
	})
	if err != nil {
		err = d.noRoom(s.ID, withTail(d.atGuestsTotal(fmt.Errorf("oci: %s %s %s: %w", d.name, verb, s.ID, err))))
		d.cleanupFailed(s.ID)
		return err
	}
	d.rememberInit(s.ID, pf, state)
	d.log.Debug("guest "+verb, "id", s.ID, "took", time.Since(t0))
	return nil
}

// runtimeStartTimeout bounds a runtime command that starts a guest (create, run, restore),
// which runs to its end whatever its caller's context says.
const runtimeStartTimeout = 2 * time.Minute

// slowStartWarn is how long a runtime's start of a guest runs before the driver warns of it.
// One takes well under a second here; one that outlasts a session's provisioning deadline
// would otherwise leave no trace until it ends, up to runtimeStartTimeout later.
const slowStartWarn = 10 * time.Second

// startsGuest runs start, a runtime command that starts a guest, to its end even when ctx
// ends first: runsc killed in the middle of its create or restore can leave a sandbox running
// that its state does not know, and that no delete then finds (a warm-pool boot cut off by a
// node's stop once left one running). A start that ctx no longer wants is then an error of
// ctx, and the caller deletes what it made. A start still running after warnAfter is logged
// to log, naming what (the runtime's command) and guest id.
func startsGuest(ctx context.Context, log *slog.Logger, warnAfter time.Duration, what, id string, start func(context.Context) error) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runtimeStartTimeout)
	defer cancel()
	t0 := time.Now()
	slow := time.AfterFunc(warnAfter, func() {
		log.Warn("oci: a guest's start is slow (the host may be overloaded)", "command", what, "id", id, "running", time.Since(t0).Round(time.Millisecond))
	})
	defer slow.Stop()
	if err := start(sctx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("started, but no longer wanted: %w", err)
	}
	return nil
}

// rememberInit notes the process the runtime's create or restore wrote to pid file pf, so
// that Events can follow the guest without asking the runtime for its state (on runsc, a
// `runsc state` is a process start and a sandbox RPC: tens of ms on a session's first
// moments, a second on a loaded host). A pid file that cannot be read leaves Events to ask
// the runtime, as it does for a guest this driver found after a restart.
func (d *Driver) rememberInit(id, pf string, state hypervisor.State) {
	pid, err := gorunc.ReadPidFile(pf)
	if err != nil {
		d.log.Debug("create: no pid file", "id", id, "err", err)
		return
	}
	start, ok := proc.Start(pid)
	if !ok {
		return
	}
	d.initMu.Lock()
	d.inits[id] = initProc{pid: pid, start: start, state: state}
	d.initMu.Unlock()
}

// knownState is guest id's state without a runtime call, for a guest this driver created or
// restored: stopped once the process its create found is gone, else what the driver last did
// to it. false for a guest it found after a restart (ask Info).
func (d *Driver) knownState(id string) (hypervisor.State, bool) {
	p, alive, ok := d.lookupInit(id)
	switch {
	case !ok:
		return "", false
	case !alive:
		return hypervisor.StateStopped, true
	}
	return p.state, true
}

// KnownRunning: a container's init is the guest's agent, so the agent lives while the
// process the driver's create found does (see knownState).
func (d *Driver) KnownRunning(id string) (running, known bool) {
	st, ok := d.knownState(id)
	return ok && st == hypervisor.StateRunning, ok
}

// setKnownState notes what the driver just did to guest id (see knownState).
func (d *Driver) setKnownState(id string, state hypervisor.State) {
	d.initMu.Lock()
	if p, ok := d.inits[id]; ok {
		p.state = state
		d.inits[id] = p
	}
	d.initMu.Unlock()
}

// knownInit answers guest id's process as its create found it, while that process lives.
func (d *Driver) knownInit(id string) (initProc, bool) {
	p, alive, _ := d.lookupInit(id)
	return p, alive
}

// lookupInit answers guest id's process as its create found it, whether that process still
// lives, and whether this driver knows it at all.
func (d *Driver) lookupInit(id string) (p initProc, alive, ok bool) {
	d.initMu.Lock()
	p, ok = d.inits[id]
	d.initMu.Unlock()
	return p, ok && proc.Alive(p.pid, p.start), ok
}

// guestCgroup is guest id's cgroup path. A guest this driver created or restored has the
// path its create wrote in the guest's record (CgroupPath), so the record is not read: an
// exec reads the guest's OOM count, and the record's read and decoding were most of that.
func (d *Driver) guestCgroup(id string) (string, error) {
	d.initMu.Lock()
	_, known := d.inits[id]
	d.initMu.Unlock()
	if known {
		return d.CgroupPath(id), nil
	}
	g, err := d.loadGuest(id)
	return g.CgroupsPath, err
}

func (d *Driver) forgetInit(id string) {
	d.initMu.Lock()
	delete(d.inits, id)
	d.initMu.Unlock()
}

// cleanupFailed removes what a failed create or restore left.
func (d *Driver) cleanupFailed(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Delete(ctx, id); err != nil {
		d.log.Warn("cleanup after failed create", "id", id, "err", err)
	}
}

// Boot starts the init process (and, with Spec.AgentSocket, waits for the agent's socket and
// seals the agent dir, see sealAgentDir).
func (d *Driver) Boot(ctx context.Context, id string) error {
	g, err := d.loadGuest(id)
	if err != nil {
		return err
	}
	if err := d.rt.Start(ctx, id); err != nil {
		return d.wrap("start", id, err)
	}
	d.setKnownState(id, hypervisor.StateRunning)
	return d.sealAgentDir(ctx, g.Spec)
}

// Pause freezes the guest (runc: cgroup freezer; runsc: the sentry stops its tasks).
func (d *Driver) Pause(ctx context.Context, id string) error {
	if _, err := d.loadGuest(id); err != nil {
		return err
	}
	if err := d.freeze(ctx, id); err != nil {
		return err
	}
	d.setKnownState(id, hypervisor.StatePaused)
	return nil
}

// freeze pauses guest id through the runtime, trying again when runc's freezer gave up
// (retryFreeze). Pause and a disk snapshot both freeze through it.
func (d *Driver) freeze(ctx context.Context, id string) error {
	if err := retryFreeze(ctx, func() error { return d.rt.Pause(ctx, id) }); err != nil {
		return d.wrap("pause", id, err)
	}
	return nil
}

// freezeAttempts and freezeBackoff bound retryFreeze.
const (
	freezeAttempts = 4
	freezeBackoff  = 100 * time.Millisecond
)

// retryFreeze runs pause, again after a short wait when it failed with runc's "unable to
// freeze": the cgroup v1 freezer gives up when the guest's tasks keep forking or sit in
// the kernel while it works (seen on loaded hosts), and leaves them thawed, so another try
// is safe. Any other failure, or the last one, is returned as is.
func retryFreeze(ctx context.Context, pause func() error) error {
	var err error
	for i := range freezeAttempts {
		if err = pause(); err == nil || !strings.Contains(err.Error(), "unable to freeze") {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(freezeBackoff << i):
		}
	}
	return err
}

// Resume thaws a paused guest.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if _, err := d.loadGuest(id); err != nil {
		return err
	}
	if err := d.thaw(ctx, id); err != nil {
		return err
	}
	d.setKnownState(id, hypervisor.StateRunning)
	return nil
}

// thaw resumes guest id. A runc guest's freezer is thawed directly, as `runc resume` does,
// without a runc process: that process start was 20 of a resume's 25 ms here, and most of
// a second of it on a loaded host (the seed's bound is 1 s). When the cgroup cannot be
// thawed so (not found, or not runc's), runc or runsc does it.
func (d *Driver) thaw(ctx context.Context, id string) error {
	if d.name == RuntimeRunc {
		if p, err := d.guestCgroup(id); err == nil && d.cg.thaw(p) {
			return nil
		}
	}
	if err := d.rt.Resume(ctx, id); err != nil {
		return d.wrap("resume", id, err)
	}
	return nil
}

// Stop SIGKILLs the guest and waits until it is stopped. A guest this driver created or
// restored is known stopped once its process is gone (knownState), so the common stop asks
// the runtime only to kill: on runsc each `runsc state` is a process start and a sandbox RPC
// (about 30 ms, 17 ms of CPU, here), and a session's end used to take three. The runtime's
// state is its followed process's (see Events), so it is not asked while the process lingers;
// nor, after its one answer, for a guest an earlier driver made (adopted after a restart):
// the process that answer named is followed instead.
func (d *Driver) Stop(ctx context.Context, id string) error {
	state, known := d.knownState(id)
	var adopted initProc // the process of a guest not known, as Info named it
	if !known {
		info, err := d.Info(ctx, id)
		if err != nil {
			return err
		}
		state = info.State
		if info.Pid > 0 {
			if start, ok := proc.Start(info.Pid); ok {
				adopted = initProc{pid: info.Pid, start: start}
			}
		}
	}
	if state == hypervisor.StateStopped {
		return nil
	}
	if state == hypervisor.StatePaused && d.name == RuntimeRunsc {
		// runsc refuses to signal a paused container ("cannot signal container in state
		// paused"); runc thaws it for SIGKILL itself.
		if err := d.rt.Resume(ctx, id); err != nil {
			return d.wrap("resume before kill", id, err)
		}
	}
	if state == hypervisor.StatePaused || !d.killInit(id) {
		if err := d.rt.Kill(ctx, id, int(syscall.SIGKILL), nil); err != nil {
			return d.wrap("kill", id, err)
		}
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		if st, ok := d.knownState(id); ok && st == hypervisor.StateStopped {
			return nil
		}
		switch {
		case known:
		case adopted.pid > 0:
			if !proc.Alive(adopted.pid, adopted.start) {
				return nil
			}
		default: // no process to follow: the runtime is asked
			info, err := d.Info(ctx, id)
			if err != nil {
				return err
			}
			if state = info.State; state == hypervisor.StateStopped {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("oci: stop %s: %w", id, ctx.Err())
		case <-deadline:
			return fmt.Errorf("oci: stop %s: still %s 10s after SIGKILL", id, state)
		case <-tick.C:
		}
	}
}

// killInit SIGKILLs a guest's init, known to this driver and alive, through a pidfd instead
// of `runc kill` or `runsc kill`, a process start (about 9 ms of CPU for runc here, 17 ms and
// a sandbox RPC for runsc, once per guest's life, and a run's guest lives once). runc: the
// init is PID 1 of the guest's PID namespace, so the kernel kills every process in it with
// it, as `runc kill` does. runsc: the init is the sandbox, whose death ends the guest (its
// ptrace stubs die with it); its gofer, mounts, cgroups and state are torn down by `runsc
// delete`, as after a sandbox that crashed. The process is checked against its start time
// once the pidfd holds it, so a pid reused since is never signalled. false leaves the kill to
// the runtime.
func (d *Driver) killInit(id string) bool {
	p, alive := d.knownInit(id)
	if !alive {
		return false
	}
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if !proc.Alive(p.pid, p.start) {
		return false
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil
}

// Delete force-deletes the container and removes its bundle and cgroups. Idempotent.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if !hypervisor.ValidID(id) {
		return fmt.Errorf("oci: invalid guest id %q", id)
	}
	state, known := d.knownState(id)
	d.forgetInit(id)
	var errs []error
	if err := d.deleteContainer(ctx, id, state, known); err != nil && !isNotExist(err) {
		errs = append(errs, d.wrap("delete", id, err))
	}
	if g, err := d.loadGuest(id); err == nil {
		if err := detachDisk(g.Spec); err != nil {
			errs = append(errs, err)
		}
		if err := unmountAgentDir(g.Spec); err != nil {
			errs = append(errs, err)
		}
	}
	// The guest's last processes may leave its cgroups a second or more after its init died
	// on a loaded host (runc deletes a stopped guest without waiting for them): waited for,
	// up to guestCgroupEmptyWait, so that its directories are not left behind.
	d.cg.emptyWithin(ctx, d.CgroupPath(id), guestCgroupEmptyWait)
	if err := d.cg.removeDirs(d.CgroupPath(id)); err != nil {
		d.log.Warn("guest delete: its cgroup is left", "id", id, "err", err)
	}
	if err := unmountConsole(d.BundleDir(id)); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.BundleDir(id)); err != nil {
		errs = append(errs, fmt.Errorf("oci: remove bundle: %w", err))
	}
	return errors.Join(errs...)
}

// guestCgroupEmptyWait bounds a delete's wait for the guest's last processes to leave its
// cgroups.
const guestCgroupEmptyWait = 5 * time.Second

// forgetStopped deletes a stopped runc guest without `runc delete`, a process start (about 9
// ms of CPU here, once per guest's life, and a run's guest lives once): what runc's delete of
// a stopped container does is remove its state dir and its cgroups (Delete removes those
// next, as it does after any delete), and run the spec's poststop hooks, of which a guest has
// none. Its processes are gone: its init was PID 1 of its PID namespace, and the kernel killed
// the rest with it.
func (d *Driver) forgetStopped(id string) error {
	if err := os.RemoveAll(filepath.Join(d.rt.Root, id)); err != nil {
		return fmt.Errorf("oci: remove runc's state of %s: %w", id, err)
	}
	return nil
}

// forgetKilledSandbox deletes a runsc guest whose sandbox this driver followed and saw die (a
// run's guest, killed through its pidfd) without `runsc delete`, a process start (about 13 ms
// of CPU here, and up to 1.4 s on a loaded host, once per guest's life, and a run's guest
// lives once). What that delete does for such a guest: its gofer is SIGKILLed; its cgroups, once
// the sandbox's last processes have left them (waited for here), are removed by Delete next,
// as after any delete; and its state and lock files in the state root go. Their layout is
// the known build's alone (runscBuildKnown), so other builds are deleted by runsc. false,
// having changed nothing runsc could not redo, leaves the delete to runsc.
func (d *Driver) forgetKilledSandbox(ctx context.Context, id string) bool {
	base := filepath.Join(d.rt.Root, id+"_sandbox:"+id)
	var st struct {
		ID       string `json:"id"`
		GoferPid int    `json:"goferPid"`
		Sandbox  struct {
			ID string `json:"id"`
		} `json:"sandbox"`
	}
	if err := guestfile.ReadJSON(base+".state", &st); err != nil || st.ID != id || st.Sandbox.ID != id {
		return false
	}
	if st.GoferPid > 0 && !d.goferGone(ctx, id, st.GoferPid) {
		return false
	}
	// The gofer and the sandbox's ptrace stubs exit after it, on a loaded host a second or more
	// later; until then its cgroups cannot be removed (runsc's delete waited as long).
	if !d.cg.emptyWithin(ctx, d.CgroupPath(id), guestCgroupEmptyWait) {
		return false
	}
	if err := os.Remove(base + ".state"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	_ = os.Remove(base + ".lock")
	return true
}

// goferGone SIGKILLs guest id's gofer, pid, as runsc's delete does (left to exit by itself
// once its sandbox was gone, it ran on for a while, its CPU more than the delete's), and
// reports whether it is gone or going. The pid is taken for the gofer only while its command
// line names this driver's state root and the guest's bundle; the signal goes through a pidfd
// taken while it did.
func (d *Driver) goferGone(_ context.Context, id string, pid int) bool {
	isGofer := func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			return false
		}
		args := strings.Split(string(b), "\x00")
		return slices.Contains(args, "gofer") && slices.Contains(args, "--root="+d.rt.Root) && slices.Contains(args, d.BundleDir(id))
	}
	if _, alive := proc.Start(pid); !alive || !isGofer() {
		return true
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return errors.Is(err, unix.ESRCH)
	}
	defer unix.Close(fd)
	if _, alive := proc.Start(pid); !alive || !isGofer() {
		return true
	}
	err = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	return err == nil || errors.Is(err, unix.ESRCH)
}

// deleteContainer force-deletes the container. runsc's delete --force panics on a paused
// container ("invalid state transition: paused => stopped"), so a paused one is thawed
// first: known paused from what the driver did (state, known: see knownState), else asked of
// the runtime; and when a delete of a guest thought unpaused fails, the runtime is asked
// after all and the delete tried again.
func (d *Driver) deleteContainer(ctx context.Context, id string, state hypervisor.State, known bool) error {
	force := &gorunc.DeleteOpts{Force: true}
	if d.name != RuntimeRunsc {
		if known && state == hypervisor.StateStopped {
			return d.forgetStopped(id)
		}
		return d.rt.Delete(ctx, id, force)
	}
	if known && state == hypervisor.StateStopped && d.directCheckpoint && d.forgetKilledSandbox(ctx, id) {
		return nil
	}
	thawIfPaused := func() bool {
		if c, err := d.rt.State(ctx, id); err != nil || c.Status != "paused" {
			return false
		}
		if err := d.rt.Resume(ctx, id); err != nil {
			d.log.Warn("resume before delete", "id", id, "err", err)
		}
		return true
	}
	switch {
	case !known:
		thawIfPaused()
	case state == hypervisor.StatePaused:
		if err := d.rt.Resume(ctx, id); err != nil {
			d.log.Warn("resume before delete", "id", id, "err", err)
		}
	}
	err := d.rt.Delete(ctx, id, force)
	if err != nil && known && !isNotExist(err) && thawIfPaused() {
		err = d.rt.Delete(ctx, id, force)
	}
	return err
}

// Info reports the runtime's view of the guest.
func (d *Driver) Info(ctx context.Context, id string) (hypervisor.Info, error) {
	if _, err := d.loadGuest(id); err != nil {
		return hypervisor.Info{}, err
	}
	c, err := d.rt.State(ctx, id)
	if err != nil {
		return hypervisor.Info{}, d.wrap("state", id, err)
	}
	var st hypervisor.State
	switch c.Status {
	case "created", "creating":
		st = hypervisor.StateCreated
	case "running":
		st = hypervisor.StateRunning
	case "paused", "pausing":
		st = hypervisor.StatePaused
	case "stopped":
		st = hypervisor.StateStopped
	default:
		return hypervisor.Info{}, fmt.Errorf("oci: %s state %s: unknown status %q", d.name, id, c.Status)
	}
	pid := c.Pid
	if st == hypervisor.StateStopped {
		pid = 0
	}
	return hypervisor.Info{State: st, Pid: pid}, nil
}

// OOMKills reads the count of OOM kills in the guest's cgroup (hypervisor.OOMCounter).
func (d *Driver) OOMKills(_ context.Context, id string) (int64, error) {
	cg, err := d.guestCgroup(id)
	if err != nil {
		return 0, err
	}
	n, err := d.cg.oomKills(cg)
	if err != nil {
		return 0, fmt.Errorf("oci: OOM kills of %s: %w", id, err)
	}
	return n, nil
}

// Stats reads the guest's cgroup (CPU, memory, OOM kills). It walks none of the guest's
// files: the node reads it at every sample, and a walk costs about 15 µs a file.
func (d *Driver) Stats(ctx context.Context, id string) (hypervisor.Stats, error) {
	g, err := d.loadGuest(id)
	if err != nil {
		return hypervisor.Stats{}, err
	}
	raw, err := d.cg.read(g.CgroupsPath)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return hypervisor.Stats{}, fmt.Errorf("oci: stats %s: %w", id, err)
		}
		// No cgroup (not created yet, or already cleaned up): ask the runtime.
		rs, rerr := d.rt.Stats(ctx, id)
		if rerr != nil {
			return hypervisor.Stats{}, d.wrap("events --stats", id, rerr)
		}
		raw = cgroupStats{cpuNanos: int64(rs.Cpu.Usage.Total), memoryBytes: int64(rs.Memory.Usage.Usage)}
	}
	return hypervisor.Stats{
		CPUMs:       raw.cpuNanos / 1e6,
		MemoryBytes: raw.memoryBytes,
		OOMKills:    raw.oomKills,
	}, nil
}

func isNotExist(err error) bool {
	return err != nil && strings.Contains(err.Error(), "does not exist")
}

// wrap turns a runtime error into ours, mapping "does not exist" to hypervisor.ErrNotFound.
func (d *Driver) wrap(op, id string, err error) error {
	if isNotExist(err) {
		return fmt.Errorf("oci: %s %s %s: %v: %w", d.name, op, id, err, hypervisor.ErrNotFound)
	}
	return fmt.Errorf("oci: %s %s %s: %w", d.name, op, id, err)
}
