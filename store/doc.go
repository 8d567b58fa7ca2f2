// Package store holds live state in Redis: sessions, written only through Lua scripts that
// compare state and version, reserve or release concurrency slots, maintain the list indexes
// and append the event to the project's outbox stream in one atomic step. Every key carries
// the project as its hash tag, so each script touches one Redis Cluster slot.
package store
