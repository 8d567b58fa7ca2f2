// Package redisconn owns how wb's Redis clients open their connections: plain TCP or Unix
// sockets that go-redis uses without peeking at them before every command (Dialer).
package redisconn
