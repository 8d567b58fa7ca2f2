// Package gateway is the public HTTP API v1: authentication, the admission pipeline
// (validate → rate limit → admission decision → slot + persist), sessions, snapshots, runs,
// webhook endpoints, templates, limits and usage, policy and plugin uploads, the admin routes
// for projects and plans, the OpenAPI document (openapi.json) and Prometheus metrics, and the
// exec, PTY and files proxy through which `wb serve` reaches guests.
//
// The same exec, PTY and files handlers also serve the edge's data path on each node
// (NewDataPath): Envoy sends those routes straight to the session's node, and the node runs
// this package's handlers over its own guests, in process, so that the two paths cannot drift
// apart. There a request's credential is the grant ext_authz signed (edgeauth), not an API key.
//
// The admission decision itself (Rego, then plugins, their patches composed) belongs to package
// decide; the gateway asks it through Chain, applies the patch (fields in
// decide.PatchableFields only), validates the patched request again in full, references
// included, and answers anything wrong as a 403 naming the field and the decider.
//
// The data path (exec, PTY, files) has a second door: Authz, the ext_authz gRPC service that an
// Envoy fleet asks before it sends such a request straight to the session's node (authz.go).
// Both doors authenticate alike, by API key or by the connect token that a session's connect
// URLs carry (authz_access.go), and refuse a session that is not running with the same 409;
// ext_authz caches what it reads of sessions and drops it on their events (authz_lookups.go).
//
// A desktop's guest is used through its files routes and its MCP endpoint (desktop_files.go,
// desktop_mcp.go: Streamable HTTP from the official Go SDK, stateless, behind the API key);
// both first wait for the desktop to run, and a tool call or a file sent or deleted wakes an
// asleep one (awakeDesktop, desktop_wake.go).
//
// Work that outlives one gateway's part in it runs under a lease in Redis that its gateway
// renews (leases.go): a desktop's transition, and a session's snapshot from snapshotting back
// to running. When a gateway dies mid-work, its lease runs out and another gateway's recovery
// loop resumes the transition (desktop_recovery.go) or ends the snapshot, recorded failed,
// with the session running again (snapshot_recovery.go).
//
// Every answer is a Go type, never a map: the contract's objects come from package session
// (Session, Snapshot, Run, List, DeletedObject, the exec results), the rest are in
// apiobjects.go (Policy, Plugin, Project, Limits, Usage, ...). schema_types_test.go holds each
// to its schema in openapi.json, and fails when a response names a schema with no Go type.
//
// Work is bounded per project: a buffered exec or run keeps at most Config.MaxOutputBytes of
// each stream (8 MiB; the rest is counted and dropped, "truncated": true), an answer kept for
// an Idempotency-Key replay at most Config.MaxReplayBytes, and execs in progress and async
// runs are capped per project on each gateway (429 with Retry-After past the cap). Streams
// (NDJSON exec, PTY) are not capped: every hop copies one frame at a time, so a slow reader
// slows the guest instead of filling memory.
package gateway
