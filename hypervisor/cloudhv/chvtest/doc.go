// Package chvtest is a fake Cloud Hypervisor (CH) VMM: a test double of the real
// cloud-hypervisor process that serves CH's REST API on a Unix socket, enforces CH's state
// machine and error shapes, writes CH's event-monitor stream, and runs a real guest — a runc
// container (through hypervisor/oci) — behind the VM, so that pause, snapshot and vsock act
// on something real. The library entry points are Run / New+Serve; the command fakech
// (package main below) takes CH's own flags, so a driver launches it exactly as it launches
// cloud-hypervisor:
//
//	fakech --api-socket path=<dir>/api.sock --event-monitor fd=3
//
// What only the fake needs comes from the environment:
//
//	WB_FAKECH_STATE_DIR     where the guest's mounts, runc state and bundles live (default: a
//	                        new temp dir, removed at exit; the next fakech to start removes,
//	                        with its mounts, one that a fakech killed with SIGKILL left);
//	                        it must be searchable (o+x) from /
//	WB_FAKECH_RUNC          the runc binary (default: runc on PATH)
//	WB_FAKECH_LOG           the fake's log file (default: stderr, as CH's logger without
//	                        --log-file)
//
// # What is faithful
//
// Behaviour was read from CH's source (github.com/cloud-hypervisor/cloud-hypervisor at
// ae44c2971, the commit of chspec's cloud-hypervisor.yaml):
//
//   - Routes /api/v1/<op> for vmm.ping, vmm.shutdown, vm.create, vm.boot, vm.pause, vm.resume,
//     vm.shutdown, vm.delete, vm.info, vm.counters, vm.resize, vm.add-vsock, vm.add-net,
//     vm.snapshot and vm.restore. Every request is checked with chspec's CheckRequest (a
//     failure answers 400 ["Bad Request", <the checker's message>]) and every answer with
//     CheckResponse before it is sent (a failure is a bug of the fake: logged at error level
//     and counted, see VMM.BadResponses; fakech exits 3).
//   - Error shapes (vmm/src/api/http): an error answers a JSON array of the error chain's
//     messages, outermost first, in CH's words ("Error from API", "The VM could not be
//     paused", "Cannot pause VM", "Failed to pause migratable component", "Invalid transition:
//     InvalidStateTransition(Paused, Paused)"). VmNotCreated and VmMissingConfig answer 404,
//     config validation 400 or 409 (IdentifierNotUnique), any other VM error 500, malformed
//     JSON 400 ["Failed to deserialize JSON", ...], an unknown path 404 ["Not Found"], the
//     wrong method 400 (["Bad Request"] for GET/PUT, a bare 400 otherwise, as CH's generic
//     handler), a missing body 400. vmm.shutdown answers 200.
//   - The state machine (vmm/src/lib.rs, vm.rs VmState::valid_transition): vm.create stores
//     the config (a second one: 500 "VM is already created"); vm.boot from Created runs the VM
//     (Running); pause Running→Paused and resume Paused→Running, anything else an invalid
//     transition (500); pause/resume/shutdown/snapshot/counters of a VM that is not booted:
//     500 "VM is not running"; vm.shutdown drops the VM but keeps its config, so vm.info says
//     Created again and vm.boot boots it afresh; vm.delete shuts down first and is a no-op
//     without a VM; vm.snapshot only from Paused; vm.restore only without a VM, leaves it
//     Paused, and Running with "resume": true; vm.resize, vm.add-net and vm.add-vsock on a VM
//     that is only created edit its config (204), on a booted VM answer 200 with a
//     PciDeviceInfo; a second vsock device: 500 "Too many virtio-vsock devices".
//   - Events (event_monitor/src/lib.rs): serde_json pretty-printed objects, each followed by
//     "\n\n", {"timestamp":{"secs","nanos"} since the VMM started, "source", "event",
//     "properties"}: vmm/starting, vm/booting, vm/booted, vm/pausing, vm/paused, vm/resuming,
//     vm/resumed, vm/snapshotting, vm/snapshotted, vm/restoring, vm/restored, vm/resizing,
//     vm/resized, vm/shutdown, vm/deleted, vmm/shutdown, guest/panic. As in CH, "pausing",
//     "resuming", "snapshotting" and "booting" are emitted before the state check, so a
//     refused call still emits them.
//   - The hybrid vsock socket (virtio-devices/src/vsock/unix/muxer.rs): "CONNECT <port>\n"
//     (any case, read without consuming the bytes after '\n') answers "OK <local port>\n" with
//     local ports from 2^30 upwards; a bad command or a port nobody listens on closes the
//     connection without a word; nothing is answered while the VM is paused. The socket is
//     bound at boot (an existing path fails the boot, as UnixListener::bind does) and removed
//     when the VM is shut down.
//   - The console (vmm/src/console_devices.rs): in "Pty" mode each boot and each restore opens
//     a new pseudo-terminal, its subsidiary side in raw mode, and vm.info's config names it as
//     console.file (/dev/pts/N), in place of whatever console.file was given; what the guest
//     writes to its console comes out there. "File", "Null" and "Off" are taken as given.
//   - The debug port 0x80 (devices/src/legacy/debug_port.rs): each byte the guest writes to it
//     is logged as a warning in CH's words ("[Debug I/O port: Kernel code 0x41] 3.3000000
//     seconds"), which CH's default log level shows. The guest writes the port through the
//     named pipe DebugPort (/run/ioport-0x80). As CH's logger (cloud-hypervisor/src/logger.rs),
//     fakech ignores its log's write errors (a full non-blocking pipe, a pipe without a reader)
//     and, as Rust does, SIGPIPE: a log that cannot take a line loses it.
//   - Snapshots write CH's files into destination_url (file://<existing dir>): config.json
//     (the VmConfig), state.json and memory-ranges, each created exclusively.
//   - Counters: per device id (CH's generated ids _disk0, _net1, ... for devices without one),
//     disks with CH's names (read_bytes, write_bytes, read_ops, write_ops, *_latency_*), nets
//     with rx_bytes, rx_frames, tx_bytes, tx_frames.
//
// # The guest (the "kernel")
//
// On vm.boot the fake mounts the disk with id "rootfs" (else the first disk) read-only and
// the disk "writable" (else the second) read-write, both ext4 loop mounts under the state
// dir, and runs the command line's init= as a runc guest with hypervisor/oci: the rootfs image
// is its read-only root, the writable image's workspace/, tmp/ and root/ are bound at
// /workspace, /tmp and /root (what the agent does in a real VM), cpus.boot_vcpus is its CPU
// quota and memory.size its memory limit. The command line is split as Linux does: words
// after " -- " are init's arguments; before it, parameters the kernel knows (console=, root=,
// ro, init=, panic=, ...) and module parameters (a dot in the key) are dropped, other
// KEY=VALUE words become init's environment (after HOME=/ and TERM=linux) and other words
// its arguments. With Options.NestCgroup (fakech sets it) the guest's cgroup is below the
// VMM process's own (v1: its cpuacct and memory cgroup; v2: the VMM first moves itself to
// <own>/vmm, as a cgroup with children may hold no process), so what the guest burns is
// counted as the VMM's CPU and memory, as a real CH's vCPU threads are. The vsock device is a directory: the guest sees it at /run/wb-vsock (init
// gets WB_VSOCK_UNIX_DIR=/run/wb-vsock) and listens on vsock port P as the Unix socket
// $WB_VSOCK_UNIX_DIR/P.sock; CONNECT P is spliced to it.
//
// # Deviations from real CH
//
//   - No kernel runs: payload.kernel must name a readable file, but it is never loaded;
//     initramfs and firmware are ignored. init exiting is read as a power-off
//     when its status is 0 (CH then shuts the VMM down: vm/shutdown, vm/deleted, vmm/shutdown
//     and the process exits) and as a kernel panic otherwise ("Attempted to kill init"): a VM
//     with "pvpanic": true emits guest/panic {"event":"panic"}, and the VM stays Running (a
//     hung guest), as CH with panic=0. The fake does not reboot on panic=N.
//   - The guest's "kernel" is one memory cgroup of the VM's size: an OOM kill in it is the
//     VM's. With sysctl.vm.panic_on_oom=1 (or 2) on the command line the first one is a
//     kernel panic, as in Linux: the panic line ("Kernel panic - not syncing: Out of memory:
//     ...") is written to a Pty console or appended to a File console, a VM with "pvpanic":
//     true emits guest/panic, and the guest is frozen (the VM stays Running, hung). Without
//     it the kill stays inside.
//   - That panic line is all the console carries: the guest's processes write to the runc
//     guest's own console, not to the VM's. Where CH keeps 16 KiB of a Pty console's output
//     that nobody reads (serial_buffer.rs) and drops the oldest, the fake's write waits in a
//     goroutine of its own; neither ever stalls the guest.
//   - The root image must hold every mount point the runtime needs (/proc /dev /sys /tmp
//     /root /workspace /run): the guest's root is read-only. The guest's /run is a read-only
//     host dir holding the image's /run entries (bound from the image), the vsock dir at
//     /run/wb and the symlink /run/wb-vsock → wb.
//   - Memory is not snapshotted: runc cannot save a process. memory-ranges holds the guest's
//     identity (init, arguments, environment) as JSON, state.json a placeholder. A restore
//     creates the guest from config.json's disks with init not yet started (Paused); resume
//     starts init afresh. What the guest wrote to its writable disk survives; its processes
//     and memory do not.
//   - vm.resize changes the guest's CPU quota and memory limit (runc update); there is no
//     hotplug, balloon or ACPI notification. Memory follows CH's ACPI hotplug
//     (memory_manager.rs): it grows in 128 MiB steps up to boot size + hotplug_size ("Not
//     enough space in the hotplug RAM region", "The requested hotplug memory addition is not a
//     valid size" otherwise), and a shrink or a VM without hotplug_size keeps the guest's
//     memory (the config's memory.size changes anyway, as CH's does).
//   - virtio-net (net.go): a net device whose tap exists in the VMM's network namespace (the
//     driver starts the VMM in the guest's namespace, where it made tap0) is joined to a tap
//     the fake makes in the runc guest's network namespace (eth0, eth1, ... in device order,
//     with the config's mac), and Ethernet frames are copied between the two; vm.counters
//     counts them as CH's virtio-net does (rx_bytes/rx_frames what the guest received,
//     tx_bytes/tx_frames what it sent). The "kernel" applies the command line's ip=
//     (client::gateway:netmask::device:off) to the guest's interface: the address and a
//     default route via the gateway. CH would create a tap that does not exist; the fake
//     leaves such a device unjoined (counters 0), so that a test never adds an interface to
//     the host's namespace; in library use (without Options.JoinTaps, which fakech sets) it
//     joins none. Hot-plugged net devices (vm.add-net) are listed, not joined. The
//     fake neither sets the tap's ip and mask nor uses vhost, offloads or multiqueue.
//   - A paused guest is frozen with the cgroup freezer; its vsock streams already open stay
//     open (the guest just does not answer), new CONNECTs wait for the resume.
//   - Validation is partial: device ids must be unique, boot_vcpus in 1..=max_vcpus, a kernel
//     or firmware given; other VmConfig checks of CH are not made. JSON error texts after
//     "Failed to deserialize JSON" are Go's, not serde's.
//   - vmm.ping answers version "v54.0-chvtest"; vm.info has no device_tree.
//   - SIGKILL of the fake leaves its runc guest and mounts behind (CH's guest dies with it);
//     SIGTERM/SIGINT shut down as vmm.shutdown does.
//   - Only host-initiated vsock connections are bridged: a guest connecting out to the host
//     (CH's "<socket>_<port>" listeners) is not.
//   - --api-socket fd=N is not supported; unknown flags are refused.
//
// The VMM is the child subreaper of its process (to read init's exit status), so in library
// use the test process adopts orphans of its descendants.
package chvtest
