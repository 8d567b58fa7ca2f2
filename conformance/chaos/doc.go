// Package chaos holds the fleet's chaos tests: a whole fleet on this machine (internal/fleet:
// a Redis Cluster of 3 primaries and 3 replicas, 3 `wb node`s with runc guests, 2 gateways),
// driven through the public API with the Go SDK from both gateways, while parts of it are
// killed. Each case logs its figure. The fleet keeps wb's real timings (a node counts as dead after
// wb serve's --node-timeout; WB_CHAOS_NODE_TIMEOUT sets another; a Redis primary is replaced
// after a 2 s cluster-node-timeout) but for the webhook receiver's outage, the ten
// minutes shortened to 20 s with --webhook-max-backoff 1s. TestFleet shares one fleet across
// its cases (about two minutes); TestGateways starts one with room for 24 sessions, kills a
// gateway while 20 clients create through it and then both while the nodes' timers run
// (about two minutes more: the timers' 30 s and 60 s minimums).
package chaos
