// Package cloudhv is the Cloud Hypervisor back end: a hypervisor.Driver (and
// hypervisor.AgentDialer) that runs each guest as a microVM in its own cloud-hypervisor
// process, driven over CH's REST API (package chapi) on that process's Unix socket.
//
// A guest is a directory Options.StateDir/<id>: guest.json (the spec, the VMM's pid and start
// time, the rootfs image), api.sock, vsock.sock (hybrid vsock), events (the VMM's event
// monitor, a named pipe events.pipe that the driver copies into it), vmm.log (and vmm.log.1:
// its stdout and stderr, through the named pipe vmm.pipe), console.log (and console.log.1: the
// guest's console, a pseudo-terminal that the driver copies into them), each 1 MiB at most
// (console.go), and writable.img. Its disks are raw ext4 images (package image): the template's
// rootfs plus the static wb binary as init, cached by content in Options.CacheDir and shared
// read-only, and a writable disk of Spec.DiskGiB holding workspace/, tmp/ and root/. The kernel
// command line is image.Cmdline's console and root, init= Spec.Args[0], Spec.Env as KEY=VALUE
// words (refused when the line cannot carry them), and after " -- " init's arguments, with `wb
// agent --socket X` turned into `--vsock-port 1024`.
//
// The VMM process: `<binary> --api-socket path=<dir>/api.sock --event-monitor fd=3`, in a
// session of its own, so that it outlives the node: a restarted node's driver finds every guest
// from its directory (List, Info) and reaches it again. Its fd 3 and its stdout and stderr are
// the write ends of named pipes in the guest dir, which a restarted node opens again (an
// anonymous pipe's reader would die with the node for good); what the VMM writes while no node
// reads is dropped, and what it writes faster than the node copies too, so a guest cannot make
// the host write without end (console.go). Events reads the events file from the start and
// polls its end. Each VMM is put in a cgroup of its own (<CgroupParent>/<id>, v1 or v2) before
// the VM exists, so Stats' CPU and memory cover the vCPU threads and whatever else the VMM
// runs.
//
// Lifecycle: Create starts the VMM, waits for vmm.ping and sends vm.create; Boot vm.boot;
// Pause and Resume vm.pause and vm.resume; Stop vmm.shutdown (CH stops the vCPUs at once,
// without asking the guest, and exits), SIGKILL of the VMM's process group and cgroup when it
// has not exited within Options.StopGrace; Delete stops and removes the cgroup and directory
// (never through a mount point). Info is "stopped" once the VMM is gone, else vm.info's state.
// Events ends with one EventExit on vm/shutdown, vmm/shutdown or guest/panic (the VM has a
// pvpanic device) in the event log, or on the VMM's exit. DialAgent speaks hybrid vsock:
// "CONNECT 1024\n" on vsock.sock, "OK <port>\n" back, bounded by ctx and 10 s.
//
// Snapshots: the VM is paused; with memory, CH writes its snapshot to <dir>/vm (vm.snapshot);
// the writable disk is copied sparsely into <dir>/writable.img while the VM is paused; then a
// disk-only snapshot resumes the VM and a memory snapshot stops it (the caller restores); one
// that fails resumes it. A memory snapshot first closes the connections through the guest's
// egress relay (none outlives it), and records the root disk image it ran on (snapshot.json's
// rootfs_image and rootfs_uuid, the image's filesystem UUID).
// Restore of a memory snapshot starts a new VMM and sends vm.restore {source_url, resume:
// true}. CH restores the VM exactly as the snapshot's config.json describes it, paths
// included (RestoreConfig can only replace net fds), so the driver stages a copy of the
// snapshot in the new guest's dir (files hard-linked, memory-ranges being as large as the
// guest's memory) whose config.json names the new guest's writable disk and vsock socket,
// this node's copy of the root disk image, its kernel and initramfs (loaded only should the
// guest reboot), and a new pseudo-terminal for its console. The root disk image must be the
// very one the guest ran on (same name and filesystem UUID in this node's cache dir): the
// guest's memory holds its page cache and its kernel's view of that filesystem, and another
// wb's image has another agent; without it the restore fails with ErrSnapshotImage, and the
// snapshot can be restored from its disk alone. A disk-only restore creates and boots a new VM
// on a copy of the disk.
//
// Network (guestnet.go, hypervisor.EgressRelayer): a guest's network is a namespace of its
// own, NetNamespace(id) ("wbch-" + a digest of the state dir + "-" + id), holding only
// loopback and the VM's tap, so that the guest has no route to anything but what listens
// there, the relay to the node's egress proxy. Create makes it:
//
//	ip netns add <ns>
//	ip -n <ns> link set lo up
//	ip -n <ns> tuntap add dev tap0 mode tap
//	ip -n <ns> addr add 10.0.0.1/30 dev tap0
//	ip -n <ns> link set tap0 up
//
// starts the VMM inside it (forked from a thread that entered <ns>, so CH opens tap0 there;
// `ip netns exec` would also give the VMM a mount namespace of its own and hide its mounts),
// sends vm.create with net [{id: net0, tap: tap0, ip: 10.0.0.1, mask: 255.255.255.252, mac:
// from the id}] (CH's ip and mask are the tap's, the host end) and puts the guest's own
// address on its command line as Linux's ip=10.0.0.2::10.0.0.1:255.255.255.252::eth0:off.
// The driver listens inside <ns> on 10.0.0.1:3128 and relays each connection to the node's
// egress proxy socket (Spec.AgentDir/egress.sock); the node gives guest processes
// http://10.0.0.1:3128 as their proxy (GuestProxy) and runs no relay in the agent. No
// firewall rule is needed: the namespace has no other interface and no route but the tap's
// /30, so neither the host's loopback (Redis, the node's API) nor anything else is
// reachable. Stop ends the relay and closes the connections it relays, Delete removes the namespace (with the tap) once the VMM is
// gone. A relay lives in the node's process: a new driver (New) serves the relays of the
// running guests it finds again (SO_REUSEPORT, in case the previous driver's listener is
// still open in this process), removes namespaces of its own whose guest has no record, and
// leaves a stopped guest's to Delete; Close ends them (the guests stay).
//
// Not carried into a VM: Spec.ReadOnlyBinds (a VM shares no host directories; the binds are
// logged and left out), Spec.Pids (the guest's own kernel limits its processes), and the
// agent's egress relay (its host socket in Spec.AgentDir is out of a VM's reach; the driver
// relays instead, and drops the agent's egress flags should a spec carry them). No EventOOM: an OOM kill happens in
// the guest's kernel, which reports nothing to the host. A restore keeps the snapshot's disk
// size.
//
// Resize (hypervisor.Resizer): vm.resize. A VM is created with max_vcpus the host's CPUs and
// hotplug_size three times its memory (ACPI hotplug reserves address space, not memory), so
// vCPUs go from 1 to the host's and memory grows in 128 MiB steps up to 4× its boot size;
// memory never shrinks (CH's ACPI hotplug cannot take it back and answers a shrink with
// success while changing nothing), so the driver refuses one.
//
// Usage (Stats): CPU time and memory from the VMM's cgroup, which holds everything the VMM
// runs (a real CH's vCPU threads are the guest; the fake VMM nests its runc guest's cgroup
// below its own, so there too a busy guest is VMM CPU time), OOM kills from it, the disk
// image's allocated bytes, and NetRxBytes/NetTxBytes summed from vm.counters' virtio-net
// devices (rx_bytes, tx_bytes). Stop and Delete kill and remove the VMM's cgroup with every
// cgroup below it, in every v1 hierarchy.
package cloudhv
