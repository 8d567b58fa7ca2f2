package redisconn

import (
	"context"
	"net"
	"time"
)

// defaultTimeout is go-redis's own dial timeout, for a Dialer given none.
const defaultTimeout = 5 * time.Second

// Dialer is a go-redis Options.Dialer for a server without TLS. It dials as go-redis's own
// dialer does, and hands go-redis the connection wrapped so that it does not expose its file
// descriptor (no syscall.Conn).
//
// Why: each time go-redis takes a connection from its pool, it peeks at a syscall.Conn's
// socket (a recvfrom with MSG_PEEK) to find one the server closed. That is one more system
// call per command: on a create, which is one command, 3–4 % of the gateway's saturated
// creates/s (gateway's BenchmarkCreateSaturated, paired runs). go-redis skips the peek for
// a connection it cannot see through, as it does for every TLS connection. A connection the
// server closed is then found by the command that uses it, which go-redis retries on a new
// one (TestClosedConnectionIsRedialled); where no new one answers either (a Cluster primary
// killed, before its replica takes over), the caller gets the EOF, which the gateway counts
// as the store being away (storeUnavailable).
func Dialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	d := &net.Dialer{Timeout: timeout}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return opaque{c}, nil
	}
}

// opaque is a net.Conn and nothing more.
type opaque struct{ net.Conn }
