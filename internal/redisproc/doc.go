// Package redisproc runs the private redis-server that `wb serve` embeds when it is given no
// --redis: a real Redis, reachable only through a Unix socket in a directory that only its
// owner may enter, with a password made at random for each start, no persistence (its state
// ends with the process, as the embedded store always has), and killed with its parent.
package redisproc
