package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// forwarder is the guest's only way out: a TCP listener on the guest's loopback (the
// HTTP proxy address its processes are given) whose connections it relays, byte for byte,
// to the node's egress proxy on a host Unix socket. The node asks the runtime policy about
// each connection. Paused (a quiesce), it holds no host socket, listener or guest connection: this
// gVisor cannot checkpoint a TCP endpoint.
type forwarder struct {
	addr     string // guest loopback address to listen on
	upstream string // host Unix socket
	mu       sync.Mutex
	paused   bool
	ln       net.Listener
	left     chan struct{} // closed once serve's accept loop has let go of ln (Go closes it only then)
	// conns: both ends of every relay, the guest's (with a channel closed once its relay has
	// ended) and the host's (nil).
	conns   map[net.Conn]chan struct{}
	resumed chan struct{}
}

func newForwarder(addr, upstream string) *forwarder {
	return &forwarder{addr: addr, upstream: upstream, conns: map[net.Conn]chan struct{}{}, resumed: make(chan struct{}, 1)}
}

// errPaused: listen was called while the forwarder is paused, and opened nothing.
var errPaused = errors.New("the egress relay is paused")

// listen opens the listener; Serve calls it first so that a bad address fails at start. It
// binds under mu, so that a pause either finds the listener to close or keeps it from being
// opened: a listener bound before a pause took mu and stored after it stayed open through
// the quiesce, which must leave no TCP endpoint to checkpoint (a cold run saw the relay
// still accept after the quiesce was answered).
func (f *forwarder) listen() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.paused {
		return errPaused
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	f.ln = ln
	return nil
}

// serve accepts until ctx ends, listening again after every pause.
func (f *forwarder) serve(ctx context.Context) {
	go func() {
		<-ctx.Done()
		f.pause()
	}()
	for {
		f.mu.Lock()
		ln := f.ln
		var left chan struct{}
		if ln != nil {
			left = make(chan struct{})
			f.left = left
		}
		f.mu.Unlock()
		if ln != nil {
			for {
				c, err := ln.Accept()
				if err != nil {
					break
				}
				ended, ok := f.track(c)
				if !ok {
					_ = c.Close()
					continue
				}
				go f.relay(c, ended)
			}
			close(left)
		}
		select {
		case <-ctx.Done():
			return
		case <-f.resumed:
		}
		for ctx.Err() == nil {
			// Paused again since the resume: wait for the next one.
			if err := f.listen(); err == nil || errors.Is(err, errPaused) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// track registers guest connection c, unless the forwarder is paused, with the channel its
// relay closes once it has ended.
func (f *forwarder) track(c net.Conn) (chan struct{}, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.paused {
		return nil, false
	}
	ended := make(chan struct{})
	f.conns[c] = ended
	return ended, true
}

// relay copies between guest connection c (tracked by track) and a new connection to the
// upstream, and closes ended once it has let go of both.
func (f *forwarder) relay(c net.Conn, ended chan struct{}) {
	defer close(ended)
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		_ = c.Close()
	}()
	up, err := net.DialTimeout("unix", f.upstream, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	f.mu.Lock()
	if f.paused {
		f.mu.Unlock()
		return
	}
	f.conns[up] = nil
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.conns, up)
		f.mu.Unlock()
	}()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// pause closes the listener and every relayed connection, the guest's and the host's, until
// resume. It returns once the listening socket is gone (a blocked Accept holds it open until
// it returns) and every relay has ended: a relay's copy waiting on the guest's end is what
// gVisor refuses to checkpoint ("endpoint still has waiters upon save").
func (f *forwarder) pause() {
	f.mu.Lock()
	f.paused = true
	conns, ln, left := f.conns, f.ln, f.left
	f.conns, f.ln, f.left = map[net.Conn]chan struct{}{}, nil, nil
	f.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	for c := range conns {
		_ = c.Close()
	}
	if left != nil {
		<-left
	}
	for _, ended := range conns {
		if ended != nil {
			<-ended
		}
	}
}

func (f *forwarder) resume() {
	f.mu.Lock()
	f.paused = false
	f.mu.Unlock()
	select {
	case f.resumed <- struct{}{}:
	default:
	}
}
