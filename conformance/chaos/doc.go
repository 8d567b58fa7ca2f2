// Package chaos holds the fleet's chaos tests: a whole fleet on this machine (internal/fleet:
// a Redis Cluster of 3 primaries and 3 replicas, 3 `wb node`s with runc guests, 2 gateways),
// driven through the public API with the Go SDK from both gateways, while parts of it are
// killed. Each case logs its figures on lines that begin "figure (<timings> timings):".
//
// WB_CHAOS_TIMINGS selects the timings (timings_test.go). Short, the default and make test's:
// the webhook receiver's outage of the ten minutes shortened to 20 s with
// --webhook-max-backoff 1s, and a 2 s cluster-node-timeout. Real (make bench-chaos, run by make
// bench-fleet): ten minutes under wb's default webhook backoff and Redis's default 15 s
// cluster-node-timeout (about 25 minutes in all). In both, a node counts as dead after wb
// serve's default --node-timeout (WB_CHAOS_NODE_TIMEOUT sets another, to measure it), and the
// bounds that depend on the timings are derived from them. TestFleet shares one fleet across
// its cases (about two minutes, short); TestGateways starts one with room for 24 sessions,
// kills a gateway while 20 clients create through it and then both while the nodes' timers run
// (about two minutes more: the timers' 30 s and 60 s minimums, the API's own, in both modes).
package chaos
