package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

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
	p := &egressProxy{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.serve(w, r, gate) }))
	t.Cleanup(srv.Close)
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
