// Package agent is `wb agent`, the process inside every guest: exec, PTY and files over a
// Unix socket (OCI guests) or vsock (Cloud Hypervisor). It imports nothing else of wb's.
// It lands with the guests issue.
package agent
