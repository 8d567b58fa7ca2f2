// Package webhooks keeps each project's webhook endpoints in Redis and delivers the public
// events of the project's outbox stream to them, signed per Standard Webhooks, with durable
// retries that keep each (endpoint, session) pair in order and a bounded per-endpoint log.
package webhooks
