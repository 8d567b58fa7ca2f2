package chapi

// The types below follow cloud-hypervisor.yaml's components.schemas: the Go name is the
// schema's, the JSON names are the document's. Optional fields are omitempty, so a zero
// value leaves the server's default in force.

// VmmPingResponse is vmm.ping's answer.
type VmmPingResponse struct {
	BuildVersion string   `json:"build_version,omitempty"`
	Version      string   `json:"version"`
	Pid          int64    `json:"pid,omitempty"`
	Features     []string `json:"features,omitempty"`
}

// VmState is a VM's state as vm.info reports it.
type VmState string

// The states of VmState's enum.
const (
	VmStateCreated    VmState = "Created"
	VmStateRunning    VmState = "Running"
	VmStateShutdown   VmState = "Shutdown"
	VmStatePaused     VmState = "Paused"
	VmStateBreakPoint VmState = "BreakPoint"
)

// VmInfo is vm.info's answer.
type VmInfo struct {
	Config           VmConfig `json:"config"`
	State            VmState  `json:"state"`
	MemoryActualSize int64    `json:"memory_actual_size,omitempty"`
}

// VmCounters is vm.counters' answer: per device id (e.g. "_net2", "_disk0"), per counter
// name (e.g. "rx_bytes", "tx_bytes", "read_bytes"), a count.
type VmCounters map[string]map[string]uint64

// PciDeviceInfo is the answer of a vm.add-* call on a booted VM: the device's id and its
// PCI address.
type PciDeviceInfo struct {
	ID  string `json:"id"`
	BDF string `json:"bdf"`
}

// VmConfig is vm.create's body and part of vm.info's answer.
type VmConfig struct {
	Cpus    *CpusConfig    `json:"cpus,omitempty"`
	Memory  *MemoryConfig  `json:"memory,omitempty"`
	Payload PayloadConfig  `json:"payload"`
	Disks   []DiskConfig   `json:"disks,omitempty"`
	Net     []NetConfig    `json:"net,omitempty"`
	Serial  *ConsoleConfig `json:"serial,omitempty"`
	Console *ConsoleConfig `json:"console,omitempty"`
	Vsock   *VsockConfig   `json:"vsock,omitempty"`
	// Pvpanic adds the pvpanic device, through which a guest kernel's panic becomes a
	// "guest"/"panic" event.
	Pvpanic bool `json:"pvpanic,omitempty"`
}

// PayloadConfig is what the VM boots.
type PayloadConfig struct {
	Firmware  string `json:"firmware,omitempty"`
	Kernel    string `json:"kernel,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
}

// CpusConfig sizes the vCPUs; vm.resize can move between 1 and MaxVcpus.
type CpusConfig struct {
	BootVcpus int `json:"boot_vcpus"`
	MaxVcpus  int `json:"max_vcpus"`
}

// MemoryConfig sizes the guest's memory, in bytes. vm.resize can grow it up to Size +
// HotplugSize.
type MemoryConfig struct {
	Size          int64  `json:"size"`
	HotplugSize   int64  `json:"hotplug_size,omitempty"`
	HotplugMethod string `json:"hotplug_method,omitempty"` // "Acpi" (the default) or "VirtioMem"
	Shared        bool   `json:"shared,omitempty"`
}

// DiskConfig is one virtio-blk disk.
type DiskConfig struct {
	ID        string `json:"id,omitempty"`
	Path      string `json:"path,omitempty"`
	Readonly  bool   `json:"readonly,omitempty"`
	Direct    bool   `json:"direct,omitempty"`
	ImageType string `json:"image_type,omitempty"` // "Raw", "Qcow2", …; detected when empty
}

// NetConfig is one virtio-net device.
type NetConfig struct {
	ID        string `json:"id,omitempty"`
	Tap       string `json:"tap,omitempty"`
	IP        string `json:"ip,omitempty"`
	Mask      string `json:"mask,omitempty"`
	Mac       string `json:"mac,omitempty"`
	HostMac   string `json:"host_mac,omitempty"`
	Mtu       int    `json:"mtu,omitempty"`
	NumQueues int    `json:"num_queues,omitempty"`
	QueueSize int    `json:"queue_size,omitempty"`
}

// ConsoleConfig configures the serial port or the virtio console.
type ConsoleConfig struct {
	Mode   string `json:"mode"` // "Off", "Pty", "Tty", "File", "Socket" or "Null"
	File   string `json:"file,omitempty"`
	Socket string `json:"socket,omitempty"`
}

// VsockConfig is the virtio-vsock device; the host reaches the guest's ports through the
// hybrid-vsock Unix socket Socket ("CONNECT <port>\n").
type VsockConfig struct {
	Cid    int64  `json:"cid"` // 3 or more
	Socket string `json:"socket"`
	ID     string `json:"id,omitempty"`
}

// VmResize is vm.resize's body; a zero field is left as it is.
type VmResize struct {
	DesiredVcpus int   `json:"desired_vcpus,omitempty"`
	DesiredRam   int64 `json:"desired_ram,omitempty"` // bytes
}

// VmSnapshotConfig is vm.snapshot's body; DestinationURL is a directory URL such as
// "file:///var/lib/wb/snap/abc".
type VmSnapshotConfig struct {
	DestinationURL string `json:"destination_url,omitempty"`
}

// RestoreConfig is vm.restore's body.
type RestoreConfig struct {
	SourceURL string `json:"source_url"`
	Prefault  bool   `json:"prefault,omitempty"`
	// MemoryRestoreMode is "Copy" (the default) or "OnDemand".
	MemoryRestoreMode string `json:"memory_restore_mode,omitempty"`
	// Resume runs the restored VM at once instead of leaving it Paused.
	Resume bool `json:"resume,omitempty"`
}
