// Package suite is the open conformance suite: the rows of both seeds' tables (seed 000's
// states, transitions and their drivers, timers and warnings, pause limits, snapshots, billing
// per state, failure table and the session object field by field; seed 001's desktop states,
// transitions, what is kept and what an MCP call does in each state), each with a check that
// drives a deployment through the Go SDK (wb/client) only and says what it saw; MCP, which
// wb/client does not speak, goes through the official MCP Go SDK over the client's
// MCPHTTPClient. `wb conformance` runs it against any deployment; its test runs it against a
// `wb serve` with real guests.
//
// It owns the rows (Rows), running them (Run: bounded parallelism, a timeout per row, every
// session, snapshot and desktop it made deleted at the end, even when a check fails) and the
// report (Report.WriteTable, JSON). Short mode uses the smallest timers the API accepts
// (idle_timeout_s 30, max_lifetime_s 60); Long the seed's defaults (300, 3600), and only it
// runs the rows that need real time (the one-hour pause limit). The spend-cap rows are Serial:
// they run last and alone, since a cap on the project stops every session in it (and fails the
// start of a desktop made under it: the failed desktop the MCP 502 row calls).
package suite
