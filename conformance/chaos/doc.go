// Package chaos holds the fleet's chaos tests: a whole fleet on this machine (internal/fleet:
// a Redis Cluster of 3 primaries and 3 replicas, 3 `wb node`s with runc guests, 2 gateways),
// driven through the public API with the Go SDK from both gateways, while parts of it are
// killed. Each case logs its figure. The fleet keeps wb's real timings (a node counts as dead after
// wb serve's --node-timeout; WB_CHAOS_NODE_TIMEOUT sets another) and runs in about a minute.
package chaos
