package agent

import (
	"context"
	"io"
	"net"
	"sync"
	"time"
)

// forwarder is the guest's only way out: a TCP listener on the guest's loopback (the
// HTTP proxy address its processes are given) whose connections it relays, byte for byte,
// to the node's egress proxy on a host Unix socket. The node asks the runtime policy about
// each connection. Paused (a quiesce), it holds no host socket at all.
type forwarder struct {
	upstream string // host Unix socket
	mu       sync.Mutex
	paused   bool
	conns    map[net.Conn]struct{}
}

func newForwarder(upstream string) *forwarder {
	return &forwarder{upstream: upstream, conns: map[net.Conn]struct{}{}}
}

// serve accepts on ln until ctx ends.
func (f *forwarder) serve(ctx context.Context, ln net.Listener) {
	go func() {
		<-ctx.Done()
		_ = ln.Close()
		f.pause()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go f.relay(c)
	}
}

func (f *forwarder) relay(c net.Conn) {
	defer c.Close()
	f.mu.Lock()
	paused := f.paused
	f.mu.Unlock()
	if paused {
		return
	}
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
	f.conns[up] = struct{}{}
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

// pause closes every relayed host connection and refuses new ones until resume.
func (f *forwarder) pause() {
	f.mu.Lock()
	f.paused = true
	conns := f.conns
	f.conns = map[net.Conn]struct{}{}
	f.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}

func (f *forwarder) resume() {
	f.mu.Lock()
	f.paused = false
	f.mu.Unlock()
}
