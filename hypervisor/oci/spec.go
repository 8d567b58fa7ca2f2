package oci

import (
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"wb/hypervisor"
)

const (
	// ociVersion is what both installed runtimes (runc 1.1, runsc 2022) speak.
	ociVersion  = "1.0.2"
	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	cpuPeriod   = 100000
)

// capabilities is the minimal set a root init gets: enough to own, chmod and kill its own files
// and processes in its writable dirs; no admin, raw net, module, ptrace or mknod.
func capabilities() []string {
	return []string{
		"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
		"CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_SETGID", "CAP_SETUID",
	}
}

// maskedPaths and readonlyPaths are runc's default spec's.
func maskedPaths() []string {
	return []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
	}
}

func readonlyPaths() []string {
	return []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
}

func bindMount(src, dst string, ro bool) specs.Mount {
	mode := "rw"
	if ro {
		mode = "ro"
	}
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", mode, "nosuid", "nodev"}}
}

// specOptions are the host facts the OCI config depends on.
type specOptions struct {
	runsc       bool
	cgroupsPath string
	swap        bool   // the host accounts swap (v1 memsw / v2 memory.swap.max): pin swap to the memory limit
	nofile      uint64 // RLIMIT_NOFILE for the guest; runc cannot raise it above the caller's hard limit
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
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
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
		mounts = append(mounts, bindMount(b.Source, b.Target, true))
	}
	for _, w := range hypervisor.WritableMounts() {
		mounts = append(mounts, bindMount(filepath.Join(s.Writable, w.Subdir), w.Target, false))
	}
	mounts = append(mounts, bindMount(s.AgentDir, hypervisor.GuestAgentDir, false))
	if s.AgentBin != "" {
		mounts = append(mounts, bindMount(s.AgentBin, hypervisor.GuestAgentBin, true))
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
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			MaskedPaths:   maskedPaths(),
			ReadonlyPaths: readonlyPaths(),
		},
	}
	guestLimitsProcess(spec.Process, guestPids)
	return spec
}
