// Package loadgen drives an API open-loop at a fixed rate and reports what it saw: per
// operation p50/p99/max latency and counts, errors by HTTP status and code, the achieved rate
// against the target, and what was left behind (sessions still active, concurrency slots,
// guests). `wb load` wires it to the Go SDK; the engine knows nothing of wb's API so that its
// scheduler and its arithmetic are tested alone.
//
// Open loop, because a closed loop (each worker waits for its previous call) slows down with
// the server and so hides the server's stalls: coordinated omission. Here flow i is scheduled
// at start + i/rate by the clock whatever happened before, and the first call of each flow is
// measured from that scheduled time, so time spent waiting behind a stalled call (or for a
// free slot under the in-flight cap) counts as latency, as a real caller would feel it.
package loadgen
