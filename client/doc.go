// Package client is the Go SDK of wb's public HTTP API (/v1, API.md; the OpenAPI document the
// gateway serves at /v1/openapi.json): typed calls for sessions, snapshots, runs, exec (buffered,
// or streamed as an iterator over the NDJSON stream), files, the PTY (a WebSocket with resize),
// usage, templates, webhook endpoints, policies and plugins, and verification of the webhooks wb
// sends (Standard Webhooks).
//
// It owns the caller's side of the wire only: it imports package session for the objects the
// API shares with the platform (one definition of Session, Snapshot, Run and the exec results)
// and nothing else of wb. A test (drift_test.go) holds its types to the OpenAPI document.
//
// Every POST carries an Idempotency-Key made once per call and reused by its retries, so a
// retried create cannot make a second object. Answers 429 and 503 are retried with exponential
// backoff that honours Retry-After, up to a bounded number of attempts and never past the
// context's deadline. Error answers are *Error values (errors.As) carrying the API's status,
// type, code, param and message.
package client
