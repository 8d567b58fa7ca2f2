// Package store holds live state in Redis. Sessions are written only through Lua scripts
// that compare state and version, reserve or release concurrency slots, maintain the list
// indexes and append the event to the project's outbox stream in one atomic step (a create's
// session.pending event only when the project has a webhook endpoint, the outbox's one
// reader: scripts.go's write_pending). Beside
// them: projects, their hashed API keys and the operator's plans; idempotency records (each
// held by its request through a lease its gateway renews, so that a retry takes over the key
// of a request whose gateway died, under the same ref: idempotency.go);
// snapshots and runs (JSON objects); desktops (desktops.go: records written by
// compare-and-set on their version, each change of state appending its event to the outbox,
// and the idle deadlines of the awake ones); node and gateway registrations; placement locks; and the
// gateways' TLS certificates and ACME state with their locks (CertStorage, certmagic's
// Storage); and the announcements of changes that gateways cache (changes.go: an API key
// revoked, a plan changed, a policy or plugin stored), each waited for until every gateway
// has dropped its copy.
//
// It owns the key space: keys.go names every Redis key and channel of the platform, what each
// holds and who writes it, and other packages take their keys from it (ProjectKeys). Packages
// that run their own commands on their keys (quota, policies, webhooks, plugins) get the
// client from the wiring in cmd/wb; the client under a Store is not handed out. Every key of a
// project carries the project as its hash tag, so each script touches one Redis Cluster slot;
// on one Redis, a create's or a transition's script also writes the global signals and
// indexes, so each is one round trip (indexes.go), which concurrent admissions share under
// load (trips.go).
package store
