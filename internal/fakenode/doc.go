// Package fakenode is a node without guests for tests of the control plane (placer, gateway,
// webhooks): each session gets a real `wb agent` server, in-process, on a Unix socket in a
// temporary directory, with no isolation at all. `wb serve` never uses it.
package fakenode
