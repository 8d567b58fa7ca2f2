package oci

import (
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"wb/hypervisor"
)

const (
	// ociVersion is what both installed runtimes (runc 1.1, runsc 2022) speak.
	ociVersion  = "1.0.2"
	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	cpuPeriod   = 100000
)

// capabilities is Docker's default set, nothing more: enough for a root init to own, chmod and
// kill its own files and processes and to drop privileges; no admin, module, ptrace or time.
func capabilities() []string {
	return []string{
		"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
		"CAP_KILL", "CAP_MKNOD", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SETFCAP",
		"CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT",
	}
}

// maskedPaths and readonlyPaths are Docker's defaults (a superset of runc's).
func maskedPaths() []string {
	return []string{
		"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
}

func readonlyPaths() []string {
	return []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
}

// Guest user namespace (runc): guest uid/gid 0..guestIDCount-1 are host ids from guestRootID
// on, none of which is a host account, so guest root is an unprivileged user on the host.
const (
	guestRootID  = 100000
	guestIDCount = 65536
)

// Mount option sets. The workspace may hold programs; every other writable place is data only.
var (
	optsWorkspace = []string{"rbind", "rw", "nosuid", "nodev"}
	optsData      = []string{"rbind", "rw", "nosuid", "nodev", "noexec"}
)

// readOnlyBind is a host toolchain dir: read-only down through its submounts ("rro", which
// runc 1.1 applies with mount_setattr; gVisor's sentry makes its whole view of the bind
// read-only with plain "ro").
func readOnlyBind(src, dst string, runsc bool) specs.Mount {
	opts := []string{"rbind", "ro", "nosuid", "nodev"}
	if !runsc {
		opts = append(opts, "rro")
	}
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: opts}
}

func bindMount(src, dst string, opts []string) specs.Mount {
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: slices.Clone(opts)}
}

// specOptions are the host facts the OCI config depends on.
type specOptions struct {
	runsc       bool
	cgroupsPath string
	swap        bool   // the host accounts swap (v1 memsw / v2 memory.swap.max): pin swap to the memory limit
	nofile      uint64 // RLIMIT_NOFILE for the guest; runc cannot raise it above the caller's hard limit
	// seccomp is the guest's syscall filter (Docker's default profile, see defaultSeccomp).
	seccomp *specs.LinuxSeccomp
}

// userNS reports whether the guest gets its own user namespace: runc only, since gVisor's
// sentry is itself the guest's kernel and runs as no user the guest could become.
func (o specOptions) userNS() bool { return !o.runsc }

// guestSeccomp is the profile for this runtime. gVisor (build 2022) ignores errnoRet, so
// Docker's "clone3 fails with ENOSYS" rule would answer EPERM and glibc would not fall back to
// clone (threads fail); its sentry has no clone3 of its own, so letting the call through
// answers the same ENOSYS.
func guestSeccomp(o specOptions) *specs.LinuxSeccomp {
	if o.seccomp == nil || !o.runsc {
		return o.seccomp
	}
	sc := *o.seccomp
	sc.Syscalls = nil
	for _, r := range o.seccomp.Syscalls {
		if r.Action == specs.ActErrno && slices.Equal(r.Names, []string{"clone3"}) {
			r = specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActAllow}
		}
		sc.Syscalls = append(sc.Syscalls, r)
	}
	// The agent mounts gVisor's own pids cgroup (see guestLimitsProcess) before it drops
	// CAP_SYS_ADMIN; every later mount fails in the sentry for want of the capability.
	sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{Names: []string{"mount", "umount2"}, Action: specs.ActAllow})
	return &sc
}

// defaultSeccomp is Docker's default seccomp profile (github.com/moby/profiles/seccomp) for a
// process with capabilities(), syscalls outside it failing with EPERM, for this machine's own
// architecture alone (nativeArch). Docker's also admits the 32-bit ABIs (i386 and x32 beside
// x86_64): the kernel's compat entry points, a long record of privilege escalations, which
// gVisor does not offer at all. A guest's 32-bit system call now kills its thread (SIGSYS),
// on runc as it fails on runsc. And runc's init compiles the filter for every architecture
// listed, at each guest's start: one instead of three is 18 ms less CPU and wall time per
// `runc run` here (57 → 39 ms, 30 runs each; 34 ms without any filter).
func defaultSeccomp() (*specs.LinuxSeccomp, error) {
	caps := capabilities()
	p, err := seccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}})
	if err != nil {
		return nil, fmt.Errorf("oci: default seccomp profile: %w", err)
	}
	if a, ok := nativeArch(runtime.GOARCH); ok {
		p.Architectures = []specs.Arch{a}
	}
	return p, nil
}

// nativeArch is the seccomp architecture of a 64-bit GOARCH; false for the rest, which keep
// Docker's list.
func nativeArch(goarch string) (specs.Arch, bool) {
	switch goarch {
	case "amd64":
		return specs.ArchX86_64, true
	case "arm64":
		return specs.ArchAARCH64, true
	case "ppc64le":
		return specs.ArchPPC64LE, true
	case "s390x":
		return specs.ArchS390X, true
	case "riscv64":
		return specs.ArchRISCV64, true
	}
	return "", false
}

// guestNofile is 65536 open files, or less when this process's hard limit is lower.
func guestNofile() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Max < 65536 {
		return rl.Max
	}
	return 65536
}

// ociSpec turns a guest Spec into an OCI runtime config.
func ociSpec(s hypervisor.Spec, o specOptions) *specs.Spec {
	env := slices.Clone(s.Env)
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		env = append(env, defaultPath)
	}
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "HOME=") }) {
		env = append(env, "HOME=/root")
	}
	caps := capabilities()

	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "noexec", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
	}
	if !o.runsc {
		mounts = append(mounts, specs.Mount{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}})
	}
	mounts = append(mounts, specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}})

	// Toolchain binds first, parents before children, so that later binds land on top.
	binds := slices.Clone(s.ReadOnlyBinds)
	slices.SortStableFunc(binds, func(a, b hypervisor.Bind) int {
		return strings.Count(filepath.Clean(a.Target), "/") - strings.Count(filepath.Clean(b.Target), "/")
	})
	for _, b := range binds {
		mounts = append(mounts, readOnlyBind(b.Source, b.Target, o.runsc))
	}
	for _, w := range hypervisor.WritableMounts() {
		opts := optsData
		if w.Target == hypervisor.GuestWorkspace {
			opts = optsWorkspace
		}
		mounts = append(mounts, bindMount(filepath.Join(s.Writable, w.Subdir), w.Target, opts))
	}
	mounts = append(mounts, bindMount(s.AgentDir, hypervisor.GuestAgentDir, optsData))
	if s.AgentBin != "" {
		mounts = append(mounts, bindMount(s.AgentBin, hypervisor.GuestAgentBin, []string{"bind", "ro", "nosuid", "nodev"}))
	}

	res := &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}}
	if s.MemoryMiB > 0 {
		limit := int64(s.MemoryMiB) << 20
		res.Memory = &specs.LinuxMemory{Limit: &limit}
		if o.swap {
			swap := limit // memory+swap == memory: no swap
			res.Memory.Swap = &swap
		}
	}
	if s.VCPU > 0 {
		quota, period := int64(s.VCPU)*cpuPeriod, uint64(cpuPeriod)
		res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	hostPids, guestPids := pidsLimits(s.Pids, s.MemoryMiB, o.runsc) // see cgroup.go
	if hostPids > 0 {
		res.Pids = &specs.LinuxPids{Limit: &hostPids}
	}

	namespaces := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
	}
	var uidMap, gidMap []specs.LinuxIDMapping
	if o.userNS() {
		namespaces = append(namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		uidMap = []specs.LinuxIDMapping{{ContainerID: 0, HostID: guestRootID, Size: guestIDCount}}
		gidMap = slices.Clone(uidMap)
	}

	spec := &specs.Spec{
		Version: ociVersion,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: slices.Clone(s.Args),
			Env:  env,
			Cwd:  hypervisor.GuestWorkspace,
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: o.nofile, Soft: o.nofile}},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: s.RootFS, Readonly: true},
		Hostname: "wb-guest",
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: o.cgroupsPath,
			Resources:   res,
			// A new, empty network namespace: loopback only, so the guest cannot reach the
			// host's loopback or any other network.
			Namespaces:    namespaces,
			UIDMappings:   uidMap,
			GIDMappings:   gidMap,
			Seccomp:       guestSeccomp(o),
			MaskedPaths:   maskedPaths(),
			ReadonlyPaths: readonlyPaths(),
		},
	}
	guestLimitsProcess(spec.Process, guestPids)
	if o.runsc {
		agentProcsProcess(spec.Process)
	}
	return spec
}
