package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"wb/agent"
	"wb/hypervisor"
	"wb/internal/netguard"
	"wb/session"
)

// GuestProxy is the HTTP proxy address guest processes are given: the agent relays it to the
// node's egress proxy. Guests have no other way out (no network but loopback). A driver
// that gives its guests a network of their own (hypervisor.EgressRelayer) names its own.
const GuestProxy = "127.0.0.1:3128"

// egressEnv is the proxy environment of every guest process, for the proxy at host:port
// proxy. Loopback stays in the guest.
func egressEnv(proxy string) []string {
	u := "http://" + proxy
	return []string{"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "http_proxy=" + u, "https_proxy=" + u,
		"NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1"}
}

// egressProxy serves one guest's egress socket: each connection (CONNECT host:port, or a
// plain HTTP request in absolute form) is put to the runtime decision point as an egress
// event, then to the platform's deny list (Config.Egress); allowed ones are dialled from the
// node and their bytes out counted as egress_bytes.
type egressProxy struct {
	srv   *http.Server
	bytes atomic.Int64 // sent by the guest, since the last usage sample
	// closing ends when the proxy is stopped, and with it every request's context: srv.Close
	// leaves hijacked connections (tunnels) open, so each tunnel closes its own on it.
	closing context.Context
	stop    context.CancelFunc
	// upstreams holds a token for each tunnel or forward under way (maxEgressUpstreams), and
	// conns one for each connection the guest has open to the proxy (maxEgressConns).
	upstreams, conns chan struct{}
	// halfClosedIdle is tunnelHalfClosedIdle (tests shorten it).
	halfClosedIdle time.Duration
	// copiers counts the tunnels and forwards that move bytes. Once stopped (under cmu) none
	// starts, and close waits for those under way: the count is final when close returns,
	// and the final meter, taken after, bills every byte that went out.
	cmu     sync.Mutex
	stopped bool
	copiers sync.WaitGroup
	// lookups is its gate's pace of name lookups, which a proxy that replaces it keeps.
	lookups *rate.Limiter
}

const (
	// maxEgressUpstreams bounds one guest's tunnels and forwards under way: each holds two
	// file descriptors and a few goroutines of the node, which all its guests share. Builds
	// and browsers open tens at once; a guest past this is refused, not the node's neighbours.
	maxEgressUpstreams = 256
	// maxEgressConns bounds one guest's connections to its proxy, idle ones included (the
	// server's timeouts bound them in time only): each holds a file descriptor, a goroutine
	// and buffers of the node. Twice maxEgressUpstreams, so that a guest at that bound still
	// has as many for its clients' keep-alive pools; a connection past it is answered 429 and
	// closed.
	maxEgressConns = 2 * maxEgressUpstreams
	// copiersEndWait bounds close's wait for the tunnels and forwards to end (they end at
	// once with their connections; its caller holds the guest's lock).
	copiersEndWait = 2 * time.Second
	// tunnelHalfClosedIdle is how long a tunnel one way of which has ended waits for the other
	// to send (each read again): a peer that neither sends nor closes cannot hold it for ever,
	// and a slow answer still streaming after the request ended is not cut.
	tunnelHalfClosedIdle = 30 * time.Second
)

// newEgressProxy is a guest's egress proxy through gate, not yet serving.
func newEgressProxy(gate egressGate) *egressProxy {
	if gate.lookups == nil {
		gate.lookups = newLookupPace()
	}
	p := &egressProxy{upstreams: make(chan struct{}, maxEgressUpstreams), conns: make(chan struct{}, maxEgressConns),
		halfClosedIdle: tunnelHalfClosedIdle, lookups: gate.lookups}
	p.closing, p.stop = context.WithCancel(context.Background())
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.serve(w, r, gate) }),
		ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	return p
}

// serveOn serves the proxy on ln, the guest's egress socket, until it is closed.
func (p *egressProxy) serveOn(ln net.Listener) error {
	return p.srv.Serve(&boundedListener{Listener: ln, tokens: p.conns})
}

// boundedListener accepts a connection while it has a token for it, which the connection's
// close gives back; one past the bound is told so and closed (not left waiting: a guest
// would see its connection hang, not why).
type boundedListener struct {
	net.Listener
	tokens chan struct{}
}

func (b *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := b.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case b.tokens <- struct{}{}:
			return &boundedConn{Conn: c, tokens: b.tokens}, nil
		default:
			refuseConn(c, cap(b.tokens))
		}
	}
}

// refuseConn answers a connection past the bound of max with 429 and closes it. The
// answer fits in the socket's buffer: the write does not wait for the guest.
func refuseConn(c net.Conn, max int) {
	msg := fmt.Sprintf("wb egress proxy: the session has %d connections to the proxy open already, idle ones included; close some (or shrink the clients' keep-alive pools) first\n", max)
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = fmt.Fprintf(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
	_ = c.Close()
}

// boundedConn gives its token back once, on its first close (the server's, or a tunnel's
// after its hijack).
type boundedConn struct {
	net.Conn
	tokens chan struct{}
	once   sync.Once
}

// CloseWrite ends the guest's half of a tunnel (see tunnel's closeWrite).
func (c *boundedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *boundedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.tokens })
	return err
}

// close stops the proxy: its listener, its connections, and its tunnels; once it returns the
// count of bytes grows no more.
func (p *egressProxy) close() {
	p.stop()
	_ = p.srv.Close()
	p.cmu.Lock()
	p.stopped = true
	p.cmu.Unlock()
	done := make(chan struct{})
	go func() { p.copiers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(copiersEndWait):
	}
}

// beginCopy counts a tunnel or forward about to move bytes, unless the proxy is stopped; the
// caller calls copiers.Done when it has ended.
func (p *egressProxy) beginCopy() bool {
	p.cmu.Lock()
	defer p.cmu.Unlock()
	if p.stopped {
		return false
	}
	p.copiers.Add(1)
	return true
}

// startEgress listens on the guest's egress socket. The caller holds l.mu.
func (n *Node) startEgress(l *live) {
	old := l.egress
	if old != nil {
		old.close()
	}
	sock := filepath.Join(n.guestDir(l.g.GuestID), "agent", hypervisor.EgressSocket)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		n.Logger.Warn("node: egress proxy", "session", l.g.SessionID, "err", err)
		return
	}
	// Guest root may be an unprivileged host uid (runc's user namespace): let it connect.
	if err := agent.ChmodSocket(sock, 0o666); err != nil {
		_ = ln.Close()
		n.Logger.Warn("node: egress proxy", "session", l.g.SessionID, "err", err)
		return
	}
	gate := egressGate{guard: n.Egress, ask: func(ctx context.Context, event session.GuestEvent) (Verdict, error) {
		return n.askEgress(ctx, l, event)
	}}
	if old != nil {
		// The guest is the same session's (a memory snapshot's restore, which its tenant
		// asks for): a fresh pace would give it a fresh burst of lookups each time.
		gate.lookups = old.lookups
	}
	p := newEgressProxy(gate)
	if old != nil {
		// What the old proxy counted since the last usage sample (a memory snapshot's
		// quiesce and checkpoint take seconds after the sample before it) is the new one's to
		// report: the samples read only the guest's current proxy.
		p.bytes.Add(old.bytes.Swap(0))
	}
	l.egress = p
	go func() { _ = p.serveOn(ln) }()
}

// stopEgress closes the guest's egress proxy, its tunnels included, and freezes its count of
// bytes (the final meter reads it after). The caller holds l.mu.
func (l *live) stopEgress() {
	if l.egress != nil {
		l.egress.close()
	}
}

var errNotRunning = errors.New("the session is not running")

// askEgress puts one egress event to the session's runtime decision point; a kill ends the
// session. An allowed attempt counts as activity.
func (n *Node) askEgress(ctx context.Context, l *live, event session.GuestEvent) (Verdict, error) {
	op := lockFor(l, "egress check")
	defer op.unlock()
	if l.g.State != session.Running {
		return Verdict{}, errNotRunning
	}
	var v Verdict
	var err error
	if n.Runtime != nil {
		v, err = n.check(ctx, l, event, runtimeCheckTimeout)
	}
	if err == nil && v.AllowEgress {
		op.land = n.touch(l)
	}
	return v, err
}

// egressGate decides one egress attempt: the session's policy first, the platform's deny
// list after, which no policy can lift.
type egressGate struct {
	guard *netguard.Guard
	// ask is the runtime decision point, for one egress event.
	ask func(ctx context.Context, event session.GuestEvent) (Verdict, error)
	// lookups paces the guest's name lookups, which go to the node's resolver, shared by
	// all its guests and the node itself (newEgressProxy gives each proxy its own, and
	// startEgress the proxy that replaces a guest's the one it had).
	lookups *rate.Limiter
}

const (
	// egressLookupRate and egressLookupBurst pace one guest's name lookups: a guest asking
	// for a new name in a loop (each CONNECT to a name is a lookup, and so is each plain
	// request, even on a connection kept alive) would otherwise send the node's resolver,
	// and the network's (cloud resolvers allow about a thousand packets a second for a whole
	// host), as many as it likes. A build's or a browser's burst of tens
	// of names passes at once; past the rate a lookup waits its turn, up to the lookup's
	// timeout, and is then refused with 429.
	egressLookupRate  = 64
	egressLookupBurst = 256
	// egressLookupTimeout bounds a lookup's wait for its turn, and then the lookup.
	egressLookupTimeout = 10 * time.Second
)

// newLookupPace answers a guest's pace of name lookups.
func newLookupPace() *rate.Limiter {
	return rate.NewLimiter(egressLookupRate, egressLookupBurst)
}

// egressRefusal is an attempt the gate refused, as the guest is told.
type egressRefusal struct {
	status int
	msg    string
}

// decide answers the addresses to dial for host:port, or why not.
//
// A numeric host (in any spelling a resolver accepts) is put to the policy once, with its
// address. A name is put to the policy before it is resolved, so that a guest whose policy
// allows no egress cannot use the node's resolver to send anything out; once the policy
// allows it, the name is resolved once and put to the policy again with the addresses, so
// that a rule about an address (the platform's metadata kill) matches whatever name led
// there. The addresses are then checked against the deny list, and exactly they are dialled.
func (gt egressGate) decide(ctx context.Context, host string, port int) ([]netip.Addr, *egressRefusal) {
	a, name, err := netguard.ParseHost(host)
	if err != nil {
		return nil, &egressRefusal{http.StatusBadRequest, "wb egress proxy: " + err.Error()}
	}
	var addrs []netip.Addr
	if a.IsValid() {
		addrs = []netip.Addr{a.WithZone("")}
	}
	if r := gt.allowed(ctx, host, port, addrs); r != nil {
		return nil, r
	}
	if name != "" {
		// The turn and the lookup have a timeout each: a turn that came just inside a shared
		// one left the lookup moments, and it timed out at the resolver, its token spent.
		wctx, cancel := context.WithTimeout(ctx, egressLookupTimeout)
		err := gt.lookups.Wait(wctx)
		cancel()
		if err != nil {
			return nil, &egressRefusal{http.StatusTooManyRequests, fmt.Sprintf("wb egress proxy: too many name lookups: "+
				"each CONNECT and each plain http:// request to a host name is a lookup by the node's resolver, and a "+
				"guest may make %d a second (%d at once); reuse tunnels (connections made through CONNECT) or try again later", egressLookupRate, egressLookupBurst)}
		}
		rctx, cancel := context.WithTimeout(ctx, egressLookupTimeout)
		addrs, err = gt.guard.Lookup(rctx, host)
		cancel()
		if err != nil {
			return nil, &egressRefusal{http.StatusBadGateway, "wb egress proxy: " + err.Error()}
		}
		if r := gt.allowed(ctx, host, port, addrs); r != nil {
			return nil, r
		}
	}
	if err := gt.guard.CheckAll(host, addrs); err != nil {
		return nil, &egressRefusal{http.StatusForbidden, "wb egress proxy: " + err.Error()}
	}
	return addrs, nil
}

// allowed asks the policy about one egress event; addrs nil means not resolved yet.
func (gt egressGate) allowed(ctx context.Context, host string, port int, addrs []netip.Addr) *egressRefusal {
	event := session.GuestEvent{Type: session.GuestEgress, Host: host, Port: port}
	if addrs != nil {
		event.Addresses = eventAddresses(addrs)
	}
	v, err := gt.ask(ctx, event)
	var ke *KilledError
	switch {
	case errors.As(err, &ke):
		return &egressRefusal{http.StatusForbidden, "wb egress proxy: " + ke.Error()}
	case err != nil:
		return &egressRefusal{http.StatusForbidden, "wb egress proxy: " + err.Error()}
	case !v.AllowEgress:
		return &egressRefusal{http.StatusForbidden, fmt.Sprintf("wb egress proxy: egress to %s is not allowed by the session's policy", net.JoinHostPort(host, strconv.Itoa(port)))}
	}
	return nil
}

// eventAddresses lists addrs for a policy, each under every form a rule must match
// (an IPv4-mapped address as IPv4, a NAT64 or 6to4 one with its IPv4 address too).
func eventAddresses(addrs []netip.Addr) []string {
	out := []string{}
	seen := map[netip.Addr]bool{}
	for _, a := range addrs {
		for _, f := range netguard.Forms(a) {
			if !seen[f] {
				seen[f] = true
				out = append(out, f.String())
			}
		}
	}
	return out
}

// egressTarget is the host and port a request asks for: CONNECT's authority, or an absolute
// URL's host and the port it will really use (its own, else 80 for http, 443 for https).
func egressTarget(r *http.Request) (string, int, error) {
	var host, port string
	switch {
	case r.Method == http.MethodConnect:
		var err error
		if host, port, err = net.SplitHostPort(r.Host); err != nil {
			return "", 0, errors.New("CONNECT needs host:port")
		}
	case r.URL.IsAbs() && (r.URL.Scheme == "http" || r.URL.Scheme == "https"):
		host, port = r.URL.Hostname(), r.URL.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[r.URL.Scheme]
		}
	default:
		return "", 0, errors.New("send CONNECT host:port or an absolute http:// or https:// URL")
	}
	pn, err := strconv.Atoi(port)
	if host == "" || err != nil || pn < 1 || pn > 65535 {
		return "", 0, errors.New("the target needs a host and a port 1–65535")
	}
	return host, pn, nil
}

func (p *egressProxy) serve(w http.ResponseWriter, r *http.Request, gate egressGate) {
	host, port, err := egressTarget(r)
	if err != nil {
		http.Error(w, "wb egress proxy: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(p.closing, cancel)()
	// The bound comes before the decision: a decision waits for the guest's lock and may
	// resolve a name, and a guest's thousands of requests must not queue there.
	select {
	case p.upstreams <- struct{}{}:
		defer func() { <-p.upstreams }()
	default:
		http.Error(w, fmt.Sprintf("wb egress proxy: the session has %d connections out open already; close some first", cap(p.upstreams)), http.StatusTooManyRequests)
		return
	}
	addrs, refused := gate.decide(ctx, host, port)
	if refused != nil {
		http.Error(w, refused.msg, refused.status)
		return
	}
	if !p.beginCopy() {
		http.Error(w, "wb egress proxy: the session is stopping", http.StatusServiceUnavailable)
		return
	}
	defer p.copiers.Done()
	// Only the checked addresses are dialled: nothing is resolved again.
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return gate.guard.DialAddrs(dctx, "tcp", addrs, uint16(port))
	}
	if r.Method == http.MethodConnect {
		p.tunnel(ctx, w, dial)
		return
	}
	p.forward(ctx, w, r, dial)
}

// tunnel answers CONNECT: dial, then relay both ways until both have ended, or the proxy
// is stopped.
func (p *egressProxy) tunnel(ctx context.Context, w http.ResponseWriter, dial func(context.Context, string, string) (net.Conn, error)) {
	up, err := dial(ctx, "tcp", "")
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
	// Not ctx: the server cancels the request's context at the guest's end of data, and a
	// guest may end its half and wait for the answer.
	defer context.AfterFunc(p.closing, func() { _ = c.Close(); _ = up.Close() })()
	_, _ = rw.WriteString("HTTP/1.1 200 Connection established\r\n\r\n")
	_ = rw.Flush()
	// Once one way has ended, the other has halfClosedIdle for each read: a peer that neither
	// sends nor closes cannot hold the tunnel.
	var ended atomic.Bool
	oneWay := func(dst net.Conn, src io.Reader, srcConn net.Conn) {
		_, _ = io.Copy(dst, &halfClosedReader{r: src, conn: srcConn, ended: &ended, idle: p.halfClosedIdle})
		closeWrite(dst)
		ended.Store(true)
		_ = dst.SetReadDeadline(time.Now().Add(p.halfClosedIdle)) // the other way reads dst
	}
	done := make(chan struct{}, 2)
	// The guest's bytes are counted as they go: the usage sample reads them while the tunnel
	// is open (the final one after the proxy is stopped: close waits for this to end).
	go func() { oneWay(up, &countingReader{r: io.NopCloser(rw.Reader), n: &p.bytes}, c); done <- struct{}{} }()
	go func() { oneWay(c, up, up); done <- struct{}{} }()
	<-done
	<-done
}

// forward relays one plain HTTP request (or an https:// one, which the node encrypts),
// through a transport that dials only the checked addresses and follows no redirect.
// It ends with ctx.
func (p *egressProxy) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, dial func(context.Context, string, string) (net.Conn, error)) {
	out := r.Clone(ctx)
	out.RequestURI = ""
	out.Header.Del("Proxy-Connection")
	out.Header.Del("Proxy-Authorization")
	out.Body = &countingReader{r: r.Body, n: &p.bytes}
	// The upstream is anyone's: Go's default would let it make the node hold 10 MiB of
	// response headers per request (see netguard.MaxResponseHeaderBytes).
	tr := &http.Transport{DialContext: dial, DisableKeepAlives: true, TLSHandshakeTimeout: 10 * time.Second,
		MaxResponseHeaderBytes: netguard.MaxResponseHeaderBytes}
	defer tr.CloseIdleConnections()
	p.bytes.Add(headerBytes(r))
	resp, err := tr.RoundTrip(out)
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

// countingReader adds the bytes read from r to n as they are read, so that a usage sample
// taken meanwhile bills them (the transport may still be reading a body after RoundTrip
// returns, a tunnel may stay open for the session's life).
type countingReader struct {
	r io.ReadCloser
	n *atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	if c.r == nil {
		return 0, io.EOF
	}
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error {
	if c.r == nil {
		return nil
	}
	return c.r.Close()
}

// halfClosedReader reads r, the data of conn; once ended, each read has idle to come.
type halfClosedReader struct {
	r     io.Reader
	conn  net.Conn
	ended *atomic.Bool
	idle  time.Duration
}

func (h *halfClosedReader) Read(b []byte) (int, error) {
	if h.ended.Load() {
		_ = h.conn.SetReadDeadline(time.Now().Add(h.idle))
	}
	return h.r.Read(b)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
