// Package placer moves pending sessions to provisioning: it chooses a live node by region,
// tier and free capacity, records the placement on the session, and asks the node to
// provision. It also keeps the backstops no node owns: the provisioning deadline (3 × the
// tier's cold p95) and host failure when a node's heartbeat lapses.
package placer
