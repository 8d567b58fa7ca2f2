package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"wb/session"
)

// GuestProxy is the HTTP proxy address guest processes are given: the agent relays it to the
// node's egress proxy. Guests have no other way out (no network but loopback).
const GuestProxy = "127.0.0.1:3128"

// egressEnv is the proxy environment of every guest process. Loopback stays in the guest.
func egressEnv() []string {
	u := "http://" + GuestProxy
	return []string{"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u,
		"NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1"}
}

// egressProxy serves one guest's egress socket: each connection (CONNECT host:port, or a
// plain HTTP request in absolute form) is put to the runtime decision point as an egress
// event; allowed ones are dialled from the node and their bytes out counted as egress_bytes.
type egressProxy struct {
	srv   *http.Server
	bytes atomic.Int64 // sent by the guest, since the last usage sample
}

// startEgress listens on the guest's egress socket. The caller holds l.mu.
func (n *Node) startEgress(l *live) {
	if l.egress != nil {
		_ = l.egress.srv.Close()
	}
	sock := filepath.Join(n.guestDir(l.g.GuestID), "agent", "egress.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		n.Logger.Warn("node: egress proxy", "session", l.g.SessionID, "err", err)
		return
	}
	p := &egressProxy{}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.serveEgress(l, p, w, r) }),
		ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	l.egress = p
	go func() { _ = p.srv.Serve(ln) }()
}

// stopEgress closes the guest's egress proxy. The caller holds l.mu.
func (l *live) stopEgress() {
	if l.egress != nil {
		_ = l.egress.srv.Close()
	}
}

func (n *Node) serveEgress(l *live, p *egressProxy, w http.ResponseWriter, r *http.Request) {
	host, port := r.URL.Hostname(), r.URL.Port()
	if r.Method == http.MethodConnect {
		host, port, _ = net.SplitHostPort(r.Host)
	} else if port == "" {
		port = "80"
	}
	pn, err := strconv.Atoi(port)
	if host == "" || err != nil || !(r.Method == http.MethodConnect || r.URL.IsAbs()) {
		http.Error(w, "wb egress proxy: send CONNECT host:port or an absolute http:// URL", http.StatusBadRequest)
		return
	}
	l.mu.Lock()
	if l.g.State != session.Running {
		l.mu.Unlock()
		http.Error(w, "wb egress proxy: the session is not running", http.StatusForbidden)
		return
	}
	var v Verdict
	if n.Runtime != nil {
		v, err = n.check(r.Context(), l, map[string]any{"type": "egress", "host": host, "port": pn})
	}
	if err == nil && v.AllowEgress {
		n.touch(l)
	}
	l.mu.Unlock()
	var ke *KilledError
	switch {
	case errors.As(err, &ke):
		http.Error(w, "wb egress proxy: "+ke.Error(), http.StatusForbidden)
		return
	case !v.AllowEgress:
		http.Error(w, fmt.Sprintf("wb egress proxy: egress to %s:%d is not allowed by the session's policy", host, pn), http.StatusForbidden)
		return
	}
	target := net.JoinHostPort(host, port)
	if r.Method == http.MethodConnect {
		p.tunnel(w, target)
		return
	}
	p.forward(w, r)
}

// tunnel answers CONNECT: dial, then relay both ways.
func (p *egressProxy) tunnel(w http.ResponseWriter, target string) {
	up, err := net.DialTimeout("tcp", target, 10*time.Second)
	if err != nil {
		http.Error(w, "wb egress proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer up.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "wb egress proxy: cannot tunnel", http.StatusInternalServerError)
		return
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = rw.WriteString("HTTP/1.1 200 Connection established\r\n\r\n")
	_ = rw.Flush()
	done := make(chan struct{}, 2)
	go func() { n, _ := io.Copy(up, rw.Reader); p.bytes.Add(n); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

// forward relays one plain HTTP request.
func (p *egressProxy) forward(w http.ResponseWriter, r *http.Request) {
	out := r.Clone(context.WithoutCancel(r.Context()))
	out.RequestURI = ""
	out.Header.Del("Proxy-Connection")
	out.Header.Del("Proxy-Authorization")
	cr := &countingReader{r: r.Body}
	out.Body = cr
	resp, err := http.DefaultTransport.RoundTrip(out.WithContext(r.Context()))
	p.bytes.Add(cr.n + headerBytes(r))
	if err != nil {
		http.Error(w, "wb egress proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func headerBytes(r *http.Request) int64 {
	n := int64(len(r.Method) + len(r.URL.String()) + 12)
	for k, vs := range r.Header {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n
}

type countingReader struct {
	r io.ReadCloser
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	if c.r == nil {
		return 0, io.EOF
	}
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error {
	if c.r == nil {
		return nil
	}
	return c.r.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
