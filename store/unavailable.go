package store

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Unavailable tells an error of Redis being away (a Cluster primary killed and its replica
// not yet promoted, a connection refused, reset, timed out or closed under a command) from a
// bug or a refusal: the first is for the caller to retry later. A connection the server
// closed is found by the command that uses it (go-redis does not peek at it first: see
// internal/redisconn), which then reads EOF.
func Unavailable(err error) bool {
	for _, prefix := range []string{"CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN", "READONLY"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
