// Package guestfile holds what the guest drivers (hypervisor/oci, hypervisor/cloudhv) share
// of the files they keep beside a guest or a snapshot: JSON records written atomically (so
// that a restarted node's driver finds every guest again), read back with a missing guest's
// record as hypervisor.ErrNotFound, and the disk space a directory's files take.
package guestfile
