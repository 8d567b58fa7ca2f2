// Package placer moves pending sessions to provisioning: it chooses a live node by region,
// tier and free capacity, records the placement on the session, and asks the node to
// provision. It also keeps the backstops no node owns: the provisioning deadline (3 × the
// tier's cold p95) and host failure when a node's heartbeat lapses.
//
// It works from events, not sweeps: it waits on the pending signals (store.WorkPending,
// consumer group "placer"), wakes on its own when the earliest provisioning deadline
// (store's sorted set) or a node's heartbeat may lapse, fails a dead node's sessions from
// the node's index, and retries only the projects whose sessions found no room. It walks
// every project once at start and every Config.FullSweepEvery (5 min), for signals lost
// to a crash. A wait that ends far later than meant (the host or Redis stalled) gives every
// node a full heartbeat timeout from then: the placer could not have seen the heartbeats it
// missed, and a stalled host's own node must not fail its sessions for it.
package placer
