// Package webhooks keeps each project's webhook endpoints in Redis and delivers the public
// events of the project's outbox stream to them, signed per Standard Webhooks, with durable
// retries that keep each (endpoint, session) pair in order and a bounded per-endpoint log.
//
// The dispatcher works on events, not sweeps: it waits on the outbox signals (store's
// WorkOutbox stream) and on the earliest due delivery of a global sorted set of projects, so
// an idle platform costs it nothing however many projects it has; it trims each outbox to
// what every consumer group still needs. A project with no endpoint costs it one script per
// signal: its new events are skipped unread, as a read would skip them (an event goes to the
// endpoints there are when the dispatcher reads it, never to one made later), and its outbox
// is deleted (or, if another consumer group reads it, trimmed). Its creates, the hot path,
// write no session.pending event and no signal at all (store's write_pending).
package webhooks
