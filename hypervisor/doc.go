// Package hypervisor is the guest back-end interface every driver implements (create, boot,
// pause, resume, snapshot, restore, stop, delete, info, stats) and its drivers:
// hypervisor/oci (gVisor runsc or runc) and hypervisor/cloudhv (Cloud Hypervisor's REST API).
// The drivers land with the guests issue.
package hypervisor
