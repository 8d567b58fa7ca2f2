// Package hypervisor is the guest back-end interface (Driver: create, boot, pause, resume,
// snapshot, restore, stop, delete, info, stats, events) and the types it speaks: Spec (one
// guest: template rootfs mounted read-only, a writable layer on the host for /workspace, /tmp
// and /root, the agent's dir and binary, toolchain binds, limits), Info, Stats, Event and
// SnapshotInfo.
//
// Drivers: hypervisor/oci (gVisor's runsc, or runc, through go-runc) and hypervisor/cloudhv
// (one Cloud Hypervisor microVM per guest, also an AgentDialer, an EgressRelayer: its guests'
// one way out is its relay from their tap to the node's egress proxy, and a Resizer).
// Templates (root filesystems and their digests) are assembled by hypervisor/templates.
package hypervisor
