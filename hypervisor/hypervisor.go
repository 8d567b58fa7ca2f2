package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Paths inside every guest.
const (
	// GuestWorkspace is where the guest's writable workspace is mounted.
	GuestWorkspace = "/workspace"
	// GuestAgentDir is where Spec.AgentDir is mounted; the agent's socket lives there. Drivers
	// that can make it unwritable by the guest once the agent listens (see Spec.AgentSocket).
	GuestAgentDir = "/run/wb"
	// GuestAgentBin is where Spec.AgentBin is mounted (read-only).
	GuestAgentBin = "/run/wb-bin/wb"
)

// WritableMount is one guest directory backed by a subdirectory of Spec.Writable.
type WritableMount struct {
	Subdir string // below Spec.Writable on the host
	Target string // guest path
	Mode   uint32 // permission bits of the host directory
}

// WritableMounts lists the guest directories that live in the writable layer: Spec.Writable
// holds one subdirectory per entry (created by the driver), each bind-mounted read-write.
// A snapshot saves all of them.
func WritableMounts() []WritableMount {
	return []WritableMount{
		{Subdir: "workspace", Target: GuestWorkspace, Mode: 0o755},
		{Subdir: "tmp", Target: "/tmp", Mode: 0o1777},
		{Subdir: "root", Target: "/root", Mode: 0o700},
	}
}

// WorkspaceDir is the host directory that the guest sees as /workspace.
func WorkspaceDir(writable string) string { return filepath.Join(writable, "workspace") }

// Bind is a host directory (or file) bind-mounted into the guest.
type Bind struct {
	Source string `json:"source"` // host path
	Target string `json:"target"` // guest path
}

// Spec describes one guest.
type Spec struct {
	ID            string   `json:"id"`                 // guest id (the session id); must satisfy ValidID
	RootFS        string   `json:"rootfs"`             // template root filesystem, mounted read-only
	Writable      string   `json:"writable"`           // host dir of the writable layer (see WritableMounts)
	AgentDir      string   `json:"agent_dir"`          // host dir mounted read-write at /run/wb
	AgentBin      string   `json:"agent_bin"`          // host path of the static wb binary, mounted read-only at /run/wb-bin/wb; optional
	AgentSocket   string   `json:"agent_socket"`       // file name of the agent's socket in AgentDir; when set, a driver that can seals AgentDir once it exists
	Args          []string `json:"args"`               // init process
	Env           []string `json:"env,omitempty"`      // init environment; a default PATH is added when none is given
	ReadOnlyBinds []Bind   `json:"ro_binds,omitempty"` // extra read-only binds (toolchains)
	VCPU          int      `json:"vcpu"`               // CPU quota in whole CPUs; 0 = unlimited
	MemoryMiB     int      `json:"memory_mib"`         // memory limit; 0 = unlimited
	DiskGiB       int      `json:"disk_gib"`           // disk allowance of the writable layer (reported, see Stats.DiskBytes)
	Pids          int      `json:"pids"`               // process limit; 0 = unlimited
}

// ValidID reports whether id is usable as a container id, a cgroup name and a directory name:
// 1 to 128 characters of [A-Za-z0-9_.-], starting with a letter or digit.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i, c := range []byte(id) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return true
}

// Validate checks a Spec before a driver acts on it.
func (s Spec) Validate() error {
	if !ValidID(s.ID) {
		return fmt.Errorf("hypervisor: invalid guest id %q (want [A-Za-z0-9][A-Za-z0-9_.-]{0,127})", s.ID)
	}
	for name, p := range map[string]string{"rootfs": s.RootFS, "writable": s.Writable, "agent dir": s.AgentDir} {
		if p == "" || !filepath.IsAbs(p) {
			return fmt.Errorf("hypervisor: %s must be an absolute path, got %q", name, p)
		}
	}
	if s.AgentBin != "" && !filepath.IsAbs(s.AgentBin) {
		return fmt.Errorf("hypervisor: agent bin must be an absolute path, got %q", s.AgentBin)
	}
	if s.AgentSocket != "" && (s.AgentSocket != filepath.Base(s.AgentSocket) || s.AgentSocket == "." || s.AgentSocket == "..") {
		return fmt.Errorf("hypervisor: agent socket must be a plain file name in the agent dir, got %q", s.AgentSocket)
	}
	if len(s.Args) == 0 {
		return errors.New("hypervisor: spec has no init args")
	}
	for _, b := range s.ReadOnlyBinds {
		if !filepath.IsAbs(b.Source) || !filepath.IsAbs(b.Target) {
			return fmt.Errorf("hypervisor: bind %q -> %q: both paths must be absolute", b.Source, b.Target)
		}
	}
	if s.VCPU < 0 || s.MemoryMiB < 0 || s.DiskGiB < 0 || s.Pids < 0 {
		return errors.New("hypervisor: negative resource limit")
	}
	return nil
}

// State is a guest's lifecycle state as the back end reports it.
type State string

// Guest states.
const (
	StateCreated State = "created"
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped"
)

// Info is a guest's current state.
type Info struct {
	State State `json:"state"`
	Pid   int   `json:"pid"` // host pid of the guest's init (runc) or sandbox (runsc); 0 when stopped
}

// Stats are a guest's resource counters, read from its cgroup.
type Stats struct {
	CPUMs       int64 `json:"cpu_ms"`       // CPU time used since creation
	MemoryBytes int64 `json:"memory_bytes"` // current memory usage
	OOMKills    int64 `json:"oom_kills"`    // OOM kills in the guest's cgroup
	// Bytes through the guest's network interfaces since it booted (a VM's virtio-net
	// counters); 0 for a guest without a network (hypervisor/oci's have loopback only).
	NetRxBytes int64 `json:"net_rx_bytes,omitempty"`
	NetTxBytes int64 `json:"net_tx_bytes,omitempty"`
}

// SnapshotInfo describes a snapshot written by Driver.Snapshot.
type SnapshotInfo struct {
	Memory    bool  `json:"memory"`     // the snapshot holds the guest's memory (restores running processes)
	SizeBytes int64 `json:"size_bytes"` // bytes on disk
	// RootImage names the root disk image a memory snapshot's guest ran on, where only a node
	// with that very image can restore its memory (RootImager); "" where any node can.
	RootImage string `json:"root_image,omitempty"`
}

// Event types.
const (
	EventOOM  = "oom"
	EventExit = "exit"
	// EventPids: the guest's sandbox nears its host process limit, where it would die, while
	// the guest's own process count may be well below the guest's limit (a runsc sandbox
	// under gVisor's ptrace platform: its host tasks grow with its processes' churn). Its
	// processes should be ended now. Reported again only as the count grows on.
	EventPids = "pids"
)

// Event is something that happened to a guest.
type Event struct {
	Type string    `json:"type"` // EventOOM, EventExit or EventPids
	At   time.Time `json:"at"`
	// Detail is what the driver saw of an exit (the guest's last console lines and its
	// cgroup's limits and counters) or of a sandbox near its process limit (its count and
	// limit), for the operator's log. Never shown to the tenant.
	Detail string `json:"detail,omitempty"`
}

// AgentDialer is a Driver whose guests' agents are reached through the driver (a VM's agent
// listens on vsock) rather than on the Unix socket in Spec.AgentDir.
type AgentDialer interface {
	DialAgent(ctx context.Context, id string) (net.Conn, error)
}

// EgressSocket is the file name, in Spec.AgentDir, of the Unix socket on which the node
// serves the guest's egress proxy (an HTTP proxy: CONNECT or absolute-form requests).
const EgressSocket = "egress.sock"

// EgressRelayer is a Driver whose guests have a network of their own whose one way out is
// the driver's relay to the node's egress proxy (EgressSocket in Spec.AgentDir). GuestProxy
// is that proxy's host:port as the guest reaches it: the node tells guest processes to use
// it and has the agent relay nothing (a guest of a Driver that is not one has loopback only,
// and its agent relays GuestProxy of the node to the socket).
type EgressRelayer interface {
	GuestProxy() string
}

// Resizer is a Driver that can change a running guest's CPU and memory (cloudhv: vm.resize,
// vCPU and memory hotplug). A zero argument leaves that resource as it is.
type Resizer interface {
	Resize(ctx context.Context, id string, vcpu, memoryMiB int) error
}

// MemorySnapshotter is a Driver that says whether its Snapshot can save a guest's memory
// (runsc's checkpoint, a VM's snapshot); a Driver that is not one saves the writable layer only.
type MemorySnapshotter interface {
	MemorySnapshots() bool
}

// OOMCounter is a Driver that reads a guest's count of OOM kills alone, cheaply enough to read
// around every exec: the node reads it there, so that an exec that an OOM kill ended answers
// after its session failed with oom, not up to one of Events' polls later. (A VM's kernel
// that runs out of memory panics: its guest exits, and Events says so.)
type OOMCounter interface {
	OOMKills(ctx context.Context, id string) (int64, error)
}

// LayerAdopter is a Driver that can restore a memory snapshot into a new guest which takes
// over the writable layer of the guest the snapshot was just taken from (stopped by it),
// instead of making a new disk and unpacking the snapshot's copy: the two are the same, byte
// for byte, and a new disk is most of what a restore costs beyond the runtime's own.
type LayerAdopter interface {
	RestoreAdopting(ctx context.Context, s Spec, dir, from string) error
}

// Launcher is a Driver that can create and boot a guest in one step, for less than Create
// then Boot cost (hypervisor/oci: one runtime process, `run --detach`, where they start two).
// Launch leaves what Create then Boot leave, and on failure what a failed Create leaves.
type Launcher interface {
	Launch(ctx context.Context, s Spec) error
}

// DirectLauncher is a Driver that can launch a direct guest (agent.DirectGuest): Launch, with
// the guest's init (Spec.Args) given stdio as its standard streams and no agent (Spec has no
// AgentSocket). CanLaunchDirect says whether this one can.
type DirectLauncher interface {
	CanLaunchDirect() bool
	LaunchDirect(ctx context.Context, s Spec, stdio [3]*os.File) error
}

// GuestProcess is a guest's process as its runtime sees it: its pid in the guest and its
// command name (no arguments).
type GuestProcess struct {
	PID  int
	Name string
}

// ProcessLister is a Driver that can list a guest's processes without its agent (a direct
// guest has none).
type ProcessLister interface {
	GuestProcesses(ctx context.Context, id string) ([]GuestProcess, error)
}

// CgroupOwner is a Driver whose guests' cgroups sit below a parent cgroup of its own.
// RemoveCgroupParent removes that parent once it is empty, and fails harmlessly while a
// guest's cgroup is still below it.
type CgroupOwner interface {
	RemoveCgroupParent() error
}

// ErrNotFound is returned for a guest the driver does not know.
var ErrNotFound = errors.New("hypervisor: guest not found")

// ErrLayerTooLarge is a snapshot refused for what the guest holds: its files add up to more
// than its disk allowance (a sparse file counts whole), and the snapshot would take that much
// of the host's disk. The guest runs on; the caller can shrink its files and try again.
var ErrLayerTooLarge = errors.New("the guest's files add up to more than its disk allowance")

// RootImager is a Driver whose memory snapshots restore only on a node that has the root disk
// image their guest ran on. RootImages names the images this node has, as
// SnapshotInfo.RootImage names them: the node advertises them, so that a restore of such a
// snapshot is placed on a node that can do it.
type RootImager interface {
	RootImages() []string
}

// Driver is a guest back end.
type Driver interface {
	// Name is the back end: "runsc" or "runc" for hypervisor/oci.
	Name() string
	// Create prepares the guest (bundle, writable dirs) and creates it without starting init.
	Create(ctx context.Context, s Spec) error
	// Boot starts the init process of a created guest.
	Boot(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Snapshot saves the writable layer into dir and, when memory is true and the driver can,
	// the guest's memory. A memory snapshot stops the guest; the caller restores it.
	Snapshot(ctx context.Context, id, dir string, memory bool) (SnapshotInfo, error)
	// Restore creates and runs a new guest from a snapshot dir: a memory restore when the
	// snapshot has memory, else a fresh boot on the unpacked writable layer.
	Restore(ctx context.Context, s Spec, dir string) error
	// Stop kills the guest (SIGKILL).
	Stop(ctx context.Context, id string) error
	// Delete removes the guest and its bundle; deleting an unknown guest is not an error.
	Delete(ctx context.Context, id string) error
	Info(ctx context.Context, id string) (Info, error)
	Stats(ctx context.Context, id string) (Stats, error)
	// Events streams OOM, exit and pids events until ctx ends or the guest exits (then the
	// channel closes).
	Events(ctx context.Context, id string) (<-chan Event, error)
	// KnownRunning answers, without a runtime call or a round trip into the guest, whether
	// guest id still runs with its agent: known is false where the driver cannot tell (a
	// guest it did not start, or a VM, whose agent can die while its VMM lives).
	KnownRunning(id string) (running, known bool)
}
