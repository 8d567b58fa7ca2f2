// Package oci is the local guest back end: it drives gVisor's runsc (preferred) or runc through
// github.com/containerd/go-runc. Each guest is one OCI container whose bundle (config.json,
// console log on a 4 MiB tmpfs of its own, the guest's Spec) lives under Options.BundleRoot/<id>, with the runtime's state
// under Options.StateRoot. A driver owns both roots: it lists every guest it finds there as
// its own, so no two drivers share them.
package oci
