// Package node is `wb node`: it runs guests through package hypervisor, keeps warm pools,
// enforces idle and lifetime timers locally (surviving control-plane outages), probes guest
// health, meters usage, applies runtime policy kills and serves exec, PTY and files.
// It lands with the guests issue.
package node
