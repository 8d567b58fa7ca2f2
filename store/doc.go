// Package store holds live state in Redis. Sessions are written only through Lua scripts
// that compare state and version, reserve or release concurrency slots, maintain the list
// indexes and append the event to the project's outbox stream in one atomic step. Beside
// them: projects, their hashed API keys and the operator's plans; idempotency records;
// snapshots and runs (JSON objects); node and gateway registrations; placement locks. Every
// project key carries the project as its hash tag, so each script touches one Redis Cluster
// slot.
package store
