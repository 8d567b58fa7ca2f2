package cloudhv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"wb/hypervisor/cloudhv/image"
)

// connectTimeout bounds the hybrid-vsock handshake when ctx has no earlier deadline: a paused
// VM answers no CONNECT until it resumes.
const connectTimeout = 10 * time.Second

// maxConnectReply bounds the "OK <port>\n" line (CH's host ports are u32s).
const maxConnectReply = 32

// DialAgent connects to the guest's agent over hybrid vsock: the VMM's Unix socket, then
// "CONNECT <port>\n", answered "OK <host port>\n"; the stream is then the agent's.
func (d *Driver) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	if _, err := d.running(id); err != nil {
		return nil, err
	}
	return dialVsock(ctx, filepath.Join(d.GuestDir(id), vsockSocket), image.AgentVsockPort)
}

func dialVsock(ctx context.Context, socket string, port int) (net.Conn, error) {
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("cloudhv: vsock %s: %w", socket, err)
	}
	deadline := time.Now().Add(connectTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(err error) (net.Conn, error) {
		c.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("cloudhv: vsock %s: CONNECT %d: %w", socket, port, err)
	}
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		return fail(err)
	}
	buf := make([]byte, 0, maxConnectReply)
	for {
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			line, rest := string(buf[:i]), buf[i+1:]
			if err := parseOK(line); err != nil {
				return fail(err)
			}
			if !stop() {
				return fail(ctx.Err())
			}
			_ = c.SetDeadline(time.Time{})
			if len(rest) > 0 {
				return &prefixConn{Conn: c, pending: append([]byte(nil), rest...)}, nil
			}
			return c, nil
		}
		if err != nil {
			if len(buf) == 0 {
				err = fmt.Errorf("the VMM closed the connection without an answer (no listener on port %d in the guest yet?): %w", port, err)
			}
			return fail(err)
		}
		if len(buf) == cap(buf) {
			return fail(fmt.Errorf("answer %q is not \"OK <port>\\n\"", buf))
		}
	}
}

func parseOK(line string) error {
	num, ok := bytes.CutPrefix([]byte(line), []byte("OK "))
	if !ok {
		return fmt.Errorf("answer %q is not \"OK <port>\"", line)
	}
	if _, err := strconv.ParseUint(string(num), 10, 32); err != nil {
		return fmt.Errorf("answer %q: the port is not a number", line)
	}
	return nil
}

// prefixConn is a connection whose first bytes were already read (past the OK line).
type prefixConn struct {
	net.Conn
	pending []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.pending) > 0 {
		n := copy(b, p.pending)
		p.pending = p.pending[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}
