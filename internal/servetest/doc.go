//go:build linux

// Package servetest starts a real `wb serve` for other packages' tests: its own redis-server,
// runc guests, a free loopback port, and a cleanup that stops it and removes its guests and
// mounts. The Go SDK's live test and the CLI's tests share it.
package servetest
