package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"wb/internal/netguard"
	"wb/policies"
	"wb/session"
)

// stubResolver answers names from a table and counts lookups; it never sends a packet.
type stubResolver struct {
	answers map[string][]netip.Addr
	lookups atomic.Int32
}

func (r *stubResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.lookups.Add(1)
	if a, ok := r.answers[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// noDialer fails the test if anything is dialled.
type noDialer struct{ t *testing.T }

func (d noDialer) DialContext(_ context.Context, network, address string) (net.Conn, error) {
	d.t.Errorf("dialled %s %s", network, address)
	return nil, fmt.Errorf("test: no dialling")
}

// egressServer serves p through gate on a loopback port, as a guest's egress socket would.
func egressServer(t *testing.T, gate egressGate) string {
	t.Helper()
	p := newEgressProxy(gate)
	srv := httptest.NewServer(p.srv.Handler)
	t.Cleanup(srv.Close)
	t.Cleanup(p.close)
	return srv.Listener.Addr().String()
}

// proxyRequest sends one raw request line (CONNECT authority, or GET absolute-URL) to the
// proxy and answers the status and body.
func proxyRequest(t *testing.T, proxy, method, target string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", proxy, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	host := target
	if method != http.MethodConnect {
		host = "x"
	}
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\n\r\n", method, target, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(body)
}

// countingListener is a TCP server on loopback that counts the connections it accepts.
func countingListener(t *testing.T, network, addr string) (port int, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	accepted = &atomic.Int32{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
				_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nreached\n")
			}
			c.Close()
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().(*net.TCPAddr).Port, accepted
}

func allowAll(context.Context, session.GuestEvent) (Verdict, error) {
	return Verdict{AllowEgress: true}, nil
}

// TestEgressRefusesLoopback is the attack: a session whose policy allows all egress asks
// the node's proxy for a service on the host's loopback, in every spelling. Every attempt
// is refused with 403 and the service accepts no connection; the same proxy with loopback
// opened by the operator does reach it, so the count would see one.
func TestEgressRefusesLoopback(t *testing.T) {
	port, accepted := countingListener(t, "tcp", "127.0.0.1:0")
	port6, accepted6 := countingListener(t, "tcp6", "[::1]:0")
	res := &stubResolver{answers: map[string][]netip.Addr{
		"loopback.test": {netip.MustParseAddr("127.0.0.1")},
		"mixed.test":    {netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("127.0.0.1")},
		"mapped.test":   {netip.MustParseAddr("::ffff:127.0.0.1")},
		"six.test":      {netip.MustParseAddr("::1")},
	}}
	guard, err := netguard.New(netguard.Options{Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	proxy := egressServer(t, egressGate{guard: guard, ask: allowAll})
	hosts := []string{"127.0.0.1", "127.0.0.1.", "::ffff:127.0.0.1", "0x7f000001", "2130706433", "127.1",
		"0177.0.0.1", "127.0.1", "0x7f.1", "localhost", "LocalHost.", "loopback.test", "mixed.test", "mapped.test",
		"0", "0.0.0.0"}
	for _, h := range hosts {
		authority := net.JoinHostPort(h, fmt.Sprint(port))
		for _, m := range []string{http.MethodConnect, http.MethodGet} {
			target := authority
			if m == http.MethodGet {
				target = "http://" + authority + "/"
			}
			if code, body := proxyRequest(t, proxy, m, target); code != http.StatusForbidden || !strings.Contains(body, "does not connect") {
				t.Errorf("%s %s: %d %q; want 403 naming the refused address", m, target, code, body)
			}
		}
	}
	for _, h := range []string{"::1", "::", "six.test", "localhost"} {
		target := net.JoinHostPort(h, fmt.Sprint(port6))
		if code, body := proxyRequest(t, proxy, http.MethodConnect, target); code != http.StatusForbidden {
			t.Errorf("CONNECT %s: %d %q; want 403", target, code, body)
		}
	}
	if n, n6 := accepted.Load(), accepted6.Load(); n != 0 || n6 != 0 {
		t.Fatalf("the loopback services accepted %d and %d connection(s) through the proxy", n, n6)
	}

	// Control: the operator opens loopback on purpose; now the same request gets through.
	open, err := netguard.New(netguard.Options{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	openProxy := egressServer(t, egressGate{guard: open, ask: allowAll})
	if code, body := proxyRequest(t, openProxy, http.MethodGet, fmt.Sprintf("http://0x7f000001:%d/", port)); code != 200 || !strings.Contains(body, "reached") {
		t.Fatalf("with 127.0.0.0/8 allowed: %d %q", code, body)
	}
	if accepted.Load() != 1 {
		t.Fatalf("accepted %d; want the control's 1", accepted.Load())
	}
}

// TestEgressPolicyFirst: a name is not resolved until the policy allows it (a guest denied
// egress cannot use the node's resolver to send anything out), and absolute URLs are put to
// the policy with the port they really use.
func TestEgressPolicyFirst(t *testing.T) {
	res := &stubResolver{answers: map[string][]netip.Addr{"pypi.test": {netip.MustParseAddr("151.101.0.223")}}}
	guard, err := netguard.New(netguard.Options{Resolver: res, Dialer: noDialer{t}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []session.GuestEvent
	deny := func(_ context.Context, ev session.GuestEvent) (Verdict, error) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
		return Verdict{}, nil
	}
	proxy := egressServer(t, egressGate{guard: guard, ask: deny})
	for target, port := range map[string]int{"http://exfil.pypi.test/": 80, "https://pypi.test/": 443, "http://pypi.test:8080/": 8080, "https://pypi.test:8443/x": 8443} {
		mu.Lock()
		events = nil
		mu.Unlock()
		if code, _ := proxyRequest(t, proxy, http.MethodGet, target); code != http.StatusForbidden {
			t.Errorf("GET %s: %d; want 403", target, code)
		}
		mu.Lock()
		if len(events) != 1 || events[0].Port != port || events[0].Addresses != nil {
			t.Errorf("GET %s: events %v; want one, on port %d, without addresses", target, events, port)
		}
		mu.Unlock()
	}
	if code, _ := proxyRequest(t, proxy, http.MethodConnect, "pypi.test:443"); code != http.StatusForbidden {
		t.Errorf("CONNECT: %d; want 403", code)
	}
	if n := res.lookups.Load(); n != 0 {
		t.Fatalf("%d lookup(s) made for a guest whose policy allows no egress", n)
	}
	for _, target := range []string{"ftp://pypi.test/", "/relative", "http://pypi.test:0/", "http://pypi.test:99999/"} {
		if code, _ := proxyRequest(t, proxy, http.MethodGet, target); code != http.StatusBadRequest {
			t.Errorf("GET %s: %d; want 400", target, code)
		}
	}
}

// TestEgressMetadataKill: the platform's runtime policy (the real Rego) kills a session that
// reaches for the cloud metadata address in any spelling, even when the tenant's policy
// allows all egress: the event carries the resolved addresses, and the kill matches them.
// Nothing is dialled.
func TestEgressMetadataKill(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	eng, err := policies.New(ctx, rdb, policies.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close(ctx) })
	// The platform's rules, and a tenant that allows every egress.
	ask := func(ctx context.Context, ev session.GuestEvent) (Verdict, error) {
		addrs := make([]any, len(ev.Addresses))
		for i, a := range ev.Addresses {
			addrs[i] = a
		}
		d, err := eng.Runtime(ctx, "proj_egress", "", map[string]any{"type": string(ev.Type), "host": ev.Host, "port": ev.Port, "addresses": addrs})
		if err != nil {
			return Verdict{}, err
		}
		if d.Kill {
			return Verdict{Kill: true, Rule: d.Rule}, &KilledError{Rule: d.Rule}
		}
		return Verdict{AllowEgress: true}, nil
	}
	res := &stubResolver{answers: map[string][]netip.Addr{
		"metadata.test": {netip.MustParseAddr("169.254.169.254")},
		"ecs.test":      {netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("169.254.170.2")},
		"alibaba.test":  {netip.MustParseAddr("100.100.100.200")},
		"aws6.test":     {netip.MustParseAddr("fd00:ec2::254")},
	}}
	guard, err := netguard.New(netguard.Options{Resolver: res, Dialer: noDialer{t}})
	if err != nil {
		t.Fatal(err)
	}
	proxy := egressServer(t, egressGate{guard: guard, ask: ask})
	for _, host := range []string{"169.254.169.254", "0xa9fea9fe", "2852039166", "0251.0376.0251.0376", "169.254.43518",
		"[::ffff:169.254.169.254]", "[64:ff9b::a9fe:a9fe]", "metadata.test", "ecs.test", "alibaba.test", "aws6.test",
		"metadata.google.internal", "[fd00:ec2::254]"} {
		for _, m := range []string{http.MethodConnect, http.MethodGet} {
			target := host + ":80"
			if m == http.MethodGet {
				target = "http://" + host + "/latest/meta-data/"
			}
			code, body := proxyRequest(t, proxy, m, target)
			if code != http.StatusForbidden || !strings.Contains(body, "metadata_egress") || !strings.Contains(body, "policy_violation") {
				t.Errorf("%s %s: %d %q; want 403, killed by metadata_egress (policy_violation)", m, target, code, body)
			}
		}
	}
}

// servedEgress serves a guest's egress proxy, built as startEgress builds it (with a half-closed
// tunnel's grace of 200 ms, and then as tune has it), on a loopback port; each request's
// handler sends on returned when it returns (its tunnel's copies have ended and its
// connections are closed). stop is stopEgress.
func servedEgress(t *testing.T, gate egressGate, tune func(*egressProxy)) (addr string, p *egressProxy, returned chan struct{}, stop func()) {
	t.Helper()
	p = newEgressProxy(gate)
	p.halfClosedIdle = 200 * time.Millisecond
	if tune != nil {
		tune(p)
	}
	returned = make(chan struct{}, 64)
	handler := p.srv.Handler
	p.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler.ServeHTTP(w, r)
		returned <- struct{}{}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.serveOn(ln) }()
	l := &live{egress: p}
	t.Cleanup(l.stopEgress)
	return ln.Addr().String(), p, returned, l.stopEgress
}

// loopbackGate allows every egress, loopback included (where the tests' upstreams are).
func loopbackGate(t *testing.T) egressGate {
	t.Helper()
	guard, err := netguard.New(netguard.Options{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	return egressGate{guard: guard, ask: allowAll}
}

// sinkUpstream is a tenant's server on loopback that reads everything and never answers nor
// closes on its own (closeAtOnce: it closes each connection as soon as it accepts it).
// received counts the bytes it read; each connection's end of input (EOF or an error: the
// proxy closed its side) is sent on ended.
func sinkUpstream(t *testing.T, closeAtOnce bool) (addr string, received *atomic.Int64, ended chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	received, ended = &atomic.Int64{}, make(chan error, 64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if closeAtOnce {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					received.Add(int64(n))
					if err != nil {
						ended <- err
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String(), received, ended
}

// openTunnel sends CONNECT target through the proxy and answers the guest's connection,
// established.
func openTunnel(t *testing.T, proxy, target string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", proxy, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	// Byte by byte, so that nothing after the answer's head is read here.
	var head []byte
	one := make([]byte, 1)
	for !strings.HasSuffix(string(head), "\r\n\r\n") {
		if _, err := c.Read(one); err != nil {
			t.Fatalf("CONNECT %s: %v after %q", target, err, head)
		}
		head = append(head, one[0])
	}
	if !strings.HasPrefix(string(head), "HTTP/1.1 200") {
		t.Fatalf("CONNECT %s: %q", target, head)
	}
	_ = c.SetReadDeadline(time.Time{})
	return c
}

// waitFor waits up to 30 s (a loaded machine) for what to arrive on ch.
func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("after 30 s: %s", what)
	}
	var none T
	return none
}

// TestEgressStopEndsTunnels is the leak: a guest's tunnel to a tenant's server that only
// reads (never answers, never closes) must not outlive the guest's egress proxy. stopEgress
// closes both of its connections, so its goroutines end.
func TestEgressStopEndsTunnels(t *testing.T) {
	upstream, received, ended := sinkUpstream(t, false)
	proxy, _, returned, stop := servedEgress(t, loopbackGate(t), nil)
	c := openTunnel(t, proxy, upstream)
	if _, err := c.Write(make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for received.Load() < 64<<10 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	waitFor(t, ended, "the upstream's connection is still open after stopEgress")
	waitFor(t, returned, "the tunnel is still relaying after stopEgress")
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the guest's connection after stopEgress: read %v; want it closed", err)
	}
}

// TestEgressHalfClosedTunnelEnds: once one way of a tunnel ends, the other has a bounded
// grace of silence; a tenant's server (or a guest) that neither sends nor closes cannot keep
// the tunnel, its goroutines and its connections, for ever.
func TestEgressHalfClosedTunnelEnds(t *testing.T) {
	t.Run("the guest ends, the upstream is silent", func(t *testing.T) {
		upstream, _, ended := sinkUpstream(t, false)
		proxy, _, returned, _ := servedEgress(t, loopbackGate(t), nil)
		c := openTunnel(t, proxy, upstream)
		if _, err := c.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		c.Close()
		waitFor(t, ended, "the upstream saw no end of the guest's data")
		waitFor(t, returned, "the tunnel outlives its guest's end by 30 s")
	})
	t.Run("the upstream ends, the guest is silent", func(t *testing.T) {
		upstream, _, _ := sinkUpstream(t, true)
		proxy, _, returned, _ := servedEgress(t, loopbackGate(t), nil)
		c := openTunnel(t, proxy, upstream)
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("the guest's read after the upstream's end: %v; want EOF", err)
		}
		waitFor(t, returned, "the tunnel outlives its upstream's end by 30 s")
	})
}

// TestEgressCapsUpstreams: a guest's tunnels and forwards under way are bounded; one past the
// bound is refused with 429 and a reason, and a slot freed is usable again.
func TestEgressCapsUpstreams(t *testing.T) {
	upstream, _, ended := sinkUpstream(t, false)
	proxy, _, returned, _ := servedEgress(t, loopbackGate(t), func(p *egressProxy) { p.upstreams = make(chan struct{}, 2) })
	first := openTunnel(t, proxy, upstream)
	openTunnel(t, proxy, upstream)
	if code, body := proxyRequest(t, proxy, http.MethodConnect, upstream); code != http.StatusTooManyRequests || !strings.Contains(body, "2 connections out") {
		t.Fatalf("a third CONNECT with 2 open: %d %q; want 429 naming the bound", code, body)
	}
	if code, _ := proxyRequest(t, proxy, http.MethodGet, "http://"+upstream+"/"); code != http.StatusTooManyRequests {
		t.Fatalf("a forward with 2 tunnels open: %d; want 429", code)
	}
	for range 2 { // the refusals
		waitFor(t, returned, "a refused request's handler did not return")
	}
	first.Close()
	waitFor(t, ended, "the upstream saw no end of the first tunnel")
	waitFor(t, returned, "the first tunnel did not end")
	openTunnel(t, proxy, upstream)
}

// TestEgressTunnelKeepsHalfClose: a guest that ends its half of a tunnel still gets the
// answer that follows.
func TestEgressTunnelKeepsHalfClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() { // reads the request to its end, then answers, a little later
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.Copy(io.Discard, c); err == nil {
			time.Sleep(300 * time.Millisecond)
			_, _ = io.WriteString(c, "answer")
		}
	})
	proxy, _, _, _ := servedEgress(t, loopbackGate(t), func(p *egressProxy) { p.halfClosedIdle = 10 * time.Second })
	c := openTunnel(t, proxy, ln.Addr().String())
	if _, err := io.WriteString(c, "request"); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if got, err := io.ReadAll(c); string(got) != "answer" || err != nil {
		t.Fatalf("the guest, after ending its half: read %q, %v; want the answer", got, err)
	}
}

// TestEgressCountsBytesAsTheyFlow: what a guest sends out is counted as it goes, so that a
// usage sample (and the final one, taken while tunnels may still be open) bills it; a
// long-lived tunnel is not free. Nothing is counted twice.
func TestEgressCountsBytesAsTheyFlow(t *testing.T) {
	const sent = 8 << 20
	waitCounted := func(t *testing.T, what string, n func() int64, want int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for n() < want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := n(); got < want {
			t.Fatalf("after 30 s, %s %d bytes; want %d", what, got, want)
		}
	}
	t.Run("tunnel", func(t *testing.T) {
		upstream, received, _ := sinkUpstream(t, false)
		proxy, p, returned, _ := servedEgress(t, loopbackGate(t), nil)
		c := openTunnel(t, proxy, upstream)
		if _, err := c.Write(make([]byte, sent)); err != nil {
			t.Fatal(err)
		}
		waitCounted(t, "the upstream received", received.Load, sent)
		if n := p.bytes.Load(); n != sent {
			t.Fatalf("with the tunnel open, after %d bytes sent and received: %d counted", sent, n)
		}
		c.Close()
		waitFor(t, returned, "the tunnel did not end")
		if n := p.bytes.Load(); n != sent {
			t.Fatalf("after the tunnel's end: %d counted; want %d", n, sent)
		}
	})
	t.Run("forward", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var received atomic.Int64
		answerNow, answer := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		t.Cleanup(func() { ln.Close(); answer(); wg.Wait() })
		wg.Go(func() { // reads the request's body, answers once told to
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			req, err := http.ReadRequest(bufio.NewReader(c))
			if err != nil {
				return
			}
			n, _ := io.Copy(io.Discard, req.Body)
			received.Store(n)
			<-answerNow.Done()
			_, _ = io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
		})
		proxy, p, returned, _ := servedEgress(t, loopbackGate(t), nil)
		c, err := net.DialTimeout("tcp", proxy, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST http://%s/ HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", ln.Addr(), ln.Addr(), sent)
		if _, err := c.Write(make([]byte, sent)); err != nil {
			t.Fatal(err)
		}
		waitCounted(t, "the upstream received", received.Load, sent)
		if n := p.bytes.Load(); n < sent || n > sent+4096 {
			t.Fatalf("with the answer pending, after a %d-byte body received: %d counted", sent, n)
		}
		answer()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("the answer: %v %v", resp, err)
		}
		waitFor(t, returned, "the forward did not end")
		if n := p.bytes.Load(); n < sent || n > sent+4096 {
			t.Fatalf("after the answer: %d counted; want the body's %d and the head", n, sent)
		}
	})
}

// TestEgressBoundBeforeTheDecision: requests past the bound are refused at once, not queued
// behind decisions that wait (each waits for the guest's lock, and may resolve a name): a
// review found the bound taken only after the decision.
func TestEgressBoundBeforeTheDecision(t *testing.T) {
	upstream, _, _ := sinkUpstream(t, false)
	release := make(chan struct{})
	var asked atomic.Int32
	gate := loopbackGate(t)
	gate.ask = func(ctx context.Context, _ session.GuestEvent) (Verdict, error) {
		asked.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		return Verdict{}, nil
	}
	proxy, _, _, _ := servedEgress(t, gate, func(p *egressProxy) { p.upstreams = make(chan struct{}, 2) })
	defer close(release)
	for range 2 { // two requests wait in their decision
		c, err := net.DialTimeout("tcp", proxy, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", upstream, upstream)
	}
	deadline := time.Now().Add(30 * time.Second)
	for asked.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := proxyRequest(t, proxy, http.MethodConnect, upstream); code != http.StatusTooManyRequests {
		t.Fatalf("a third CONNECT while two wait for their decision: %d %q; want 429 at once", code, body)
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("%d decisions asked, want the 2 under the bound", n)
	}
}

// TestEgressBoundsConnections: a guest's connections to its proxy, idle ones included, are
// bounded in count: one past the bound is answered 429 with the reason and closed, and a
// connection closed frees its place. Before, a guest could hold any number idle (each a
// descriptor, a goroutine and buffers of the node) for the server's timeouts.
func TestEgressBoundsConnections(t *testing.T) {
	port, _ := countingListener(t, "tcp", "127.0.0.1:0")
	proxy, _, _, _ := servedEgress(t, loopbackGate(t), func(p *egressProxy) { p.conns = make(chan struct{}, 3) })
	var idle []net.Conn
	for range 3 {
		c, err := net.DialTimeout("tcp", proxy, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		idle = append(idle, c)
	}
	c, err := net.DialTimeout("tcp", proxy, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodGet})
	if err != nil {
		t.Fatalf("a 4th connection with 3 idle open: %v; want a 429 answer", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), "3 connections to the proxy") {
		t.Fatalf("a 4th connection with 3 idle open: %d %q; want 429 naming the bound", resp.StatusCode, body)
	}
	idle[0].Close()
	target := fmt.Sprintf("http://127.0.0.1:%d/", port)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		code, body := proxyRequest(t, proxy, http.MethodGet, target)
		if code == http.StatusOK && body == "reached\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with an idle connection closed, a request still answers %d %q", code, body)
		}
	}
}

// TestEgressBoundsResponseHeaders: a forward reads at most netguard.MaxResponseHeaderBytes
// of the upstream's response headers, as the webhooks' client does; an upstream that sends
// more is answered 502 and its headers are not passed on. Before, Go's default let an
// upstream make the node hold 10 MiB of them per request.
func TestEgressBoundsResponseHeaders(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nX-Huge: %s\r\nContent-Length: 2\r\n\r\nok", strings.Repeat("h", 1<<20))
			}()
		}
	}()
	proxy, _, _, _ := servedEgress(t, loopbackGate(t), nil)
	code, body := proxyRequest(t, proxy, http.MethodGet, "http://"+ln.Addr().String()+"/")
	if code != http.StatusBadGateway || !strings.Contains(body, "exceeded") {
		t.Fatalf("an upstream's 1 MiB header: %d %q; want 502 naming the bound", code, body[:min(len(body), 200)])
	}
}

// TestEgressLookupsPaced is the attack: a guest whose policy allows egress asks its proxy for
// a new name in a loop, and each CONNECT to a name is a lookup by the node's resolver, which
// every guest of the node (and the node) shares. A guest's lookups are paced: its burst
// passes, the rest wait their turn; one whose turn would come after the lookup's timeout is
// refused at once with 429, saying why.
func TestEgressLookupsPaced(t *testing.T) {
	res := &stubResolver{}
	guard, err := netguard.New(netguard.Options{Resolver: res, Dialer: noDialer{t}})
	if err != nil {
		t.Fatal(err)
	}
	proxy := egressServer(t, egressGate{guard: guard, ask: allowAll})
	const attempts, workers = 600, 32
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= attempts; i = next.Add(1) {
				if code, body := proxyRequest(t, proxy, http.MethodConnect, fmt.Sprintf("n%d.test:443", i)); code != http.StatusBadGateway {
					t.Errorf("CONNECT n%d.test:443: %d %q; want 502 (no such host)", i, code, body)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	lookups := int64(res.lookups.Load())
	if most := egressLookupBurst + int64(egressLookupRate*elapsed.Seconds()) + 8; lookups > most {
		t.Errorf("%d CONNECTs to new names in %s made %d lookups, want at most %d (%d at once, %d a second)",
			attempts, elapsed.Round(time.Millisecond), lookups, most, egressLookupBurst, egressLookupRate)
	}

	// A turn past the lookup's timeout is refused at once.
	slow := egressServer(t, egressGate{guard: guard, ask: allowAll, lookups: rate.NewLimiter(rate.Every(time.Minute), 1)})
	if code, body := proxyRequest(t, slow, http.MethodConnect, "first.test:443"); code != http.StatusBadGateway {
		t.Fatalf("the first CONNECT: %d %q; want 502 (no such host)", code, body)
	}
	t0 := time.Now()
	code, body := proxyRequest(t, slow, http.MethodConnect, "second.test:443")
	if code != http.StatusTooManyRequests || !strings.Contains(body, "too many name lookups: each CONNECT and each plain http:// request to a host name is a lookup") {
		t.Errorf("a CONNECT whose lookup's turn is a minute away: %d %q; want 429, too many name lookups", code, body)
	}
	if el := time.Since(t0); el > egressLookupTimeout/2 {
		t.Errorf("the refusal took %s; want it at once", el)
	}
}

// slowResolver answers every name "no such host", the first at once and the others after
// delay, or their context's error if that ends first, as a resolver a round trip away does.
type slowResolver struct {
	delay   time.Duration
	lookups atomic.Int32
}

func (r *slowResolver) LookupNetIP(ctx context.Context, _, host string) ([]netip.Addr, error) {
	if r.lookups.Add(1) == 1 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	select {
	case <-time.After(r.delay):
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	case <-ctx.Done():
		return nil, &net.DNSError{Err: ctx.Err().Error(), Name: host, IsTimeout: true}
	}
}

// TestEgressLookupAfterItsTurnHasItsTime: a lookup whose turn comes just inside the lookup's
// timeout is not sent to the resolver with the moments that remain, to time out there: the
// guest waited its turn to be told its name did not resolve, the resolver was sent a query
// nobody waits for, and the token was spent on it. Its turn taken, the lookup has its time.
func TestEgressLookupAfterItsTurnHasItsTime(t *testing.T) {
	res := &slowResolver{delay: time.Second}
	guard, err := netguard.New(netguard.Options{Resolver: res, Dialer: noDialer{t}})
	if err != nil {
		t.Fatal(err)
	}
	// One lookup, then the next turn 9.5 s on: inside the lookup's 10 s.
	proxy := egressServer(t, egressGate{guard: guard, ask: allowAll,
		lookups: rate.NewLimiter(rate.Every(egressLookupTimeout-500*time.Millisecond), 1)})
	if code, body := proxyRequest(t, proxy, http.MethodConnect, "first.test:443"); code != http.StatusBadGateway || !strings.Contains(body, "no such host") {
		t.Fatalf("the first CONNECT: %d %q; want 502, no such host", code, body)
	}
	code, body := proxyRequest(t, proxy, http.MethodConnect, "second.test:443")
	if code == http.StatusBadGateway && !strings.Contains(body, "no such host") {
		t.Errorf("a CONNECT whose lookup's turn came 9.5 s on, to a resolver that answers in 1 s: %d %q; want the resolver's answer (no such host), or 429", code, body)
	}
}

// TestEgressPlainRequestsEachLookUp: a plain http:// request through the proxy is a lookup
// each, however many a guest sends on one connection to the proxy (the proxy keeps no cache,
// and decides each request): the 429 of a paced lookup, which the guest reads to know what to
// change, says so, and does not tell it that reusing its connection saves lookups.
func TestEgressPlainRequestsEachLookUp(t *testing.T) {
	res := &stubResolver{}
	guard, err := netguard.New(netguard.Options{Resolver: res, Dialer: noDialer{t}})
	if err != nil {
		t.Fatal(err)
	}
	proxy := egressServer(t, egressGate{guard: guard, ask: allowAll, lookups: rate.NewLimiter(rate.Every(time.Minute), 2)})
	c, err := net.DialTimeout("tcp", proxy, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	var last string
	for i := range 3 { // one connection kept alive: the third finds the pace spent
		fmt.Fprintf(c, "GET http://same.test/ HTTP/1.1\r\nHost: same.test\r\n\r\n")
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
		if err != nil {
			t.Fatalf("request %d on one connection: %v", i+1, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		last = fmt.Sprintf("%d %q", resp.StatusCode, b)
	}
	if n := res.lookups.Load(); n != 2 {
		t.Errorf("3 plain requests to one name on one connection made %d lookups, want 2 (each request, until the pace is spent)", n)
	}
	if !strings.Contains(last, "429") || !strings.Contains(last, "each CONNECT and each plain http:// request to a host name is a lookup") {
		t.Errorf("the third request, past the pace: %s; want 429 saying that each plain request is a lookup", last)
	}
}
