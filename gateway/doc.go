// Package gateway is the public HTTP API v1: authentication, the admission pipeline
// (validate → rate limit → admission decision → slot + persist), sessions, snapshots, runs,
// webhook endpoints, the OpenAPI document and Prometheus metrics, and the exec proxy that
// `wb serve` uses to reach guests.
package gateway
