package stallwrite

import (
	"context"
	"net"
	"syscall"
)

// NotSentLowat is how many bytes a connection's socket queues unsent once ConnContext set it
// (TCP_NOTSENT_LOWAT): a write blocked on the full socket goes on once the queue falls below
// it, that is once the caller took about that much. Four pieces keep a fast caller's
// transfer as fast as without it.
const NotSentLowat = 4 * Piece

// ConnContext is the http.Server ConnContext of a server whose answers a Writer bounds: it
// caps the bytes each connection's socket queues unsent at NotSentLowat, and answers ctx.
// Without it Linux wakes a write blocked on a full socket only once about a third of the
// send buffer (up to 4 MB) has drained: a caller must then take megabytes within the stall,
// not a piece, and one reading steadily but slowly (under some 40 KiB/s for a minute's
// stall) was taken for one that stopped.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok { // a TLS connection's
		c = nc.NetConn()
	}
	if sc, ok := c.(interface {
		SyscallConn() (syscall.RawConn, error)
	}); ok {
		setNotSentLowat(sc)
	}
	return ctx
}
