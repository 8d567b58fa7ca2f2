// Package redistest owns test helpers that start Redis backends for other
// packages' tests: real redis-server processes (single node, restartable, and
// a 3-master cluster) on loopback ports, and in-process miniredis.
package redistest
