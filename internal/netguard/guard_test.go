package netguard

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/internal/logbudget"
	"wb/internal/syncbuf"
)

// fakeResolver answers from a table and counts lookups; unknown names fail.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][][]netip.Addr // name → answers, one per successive lookup (the last repeats)
	lookups map[string]int
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lookups == nil {
		r.lookups = map[string]int{}
	}
	as, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	i := min(r.lookups[host], len(as)-1)
	r.lookups[host]++
	return as[i], nil
}

// fakeDialer records what it was asked to dial and never opens a socket.
type fakeDialer struct {
	mu     sync.Mutex
	dialed []string
}

func (d *fakeDialer) DialContext(_ context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, network+" "+address)
	d.mu.Unlock()
	c1, c2 := net.Pipe()
	c2.Close()
	return c1, nil
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func newGuard(t *testing.T, o Options) *Guard {
	t.Helper()
	g, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestDenyList: every range of the platform deny list, at its edges and inside, and the
// public addresses just outside, with no setting that opens anything.
func TestDenyList(t *testing.T) {
	g := newGuard(t, Options{})
	cases := []struct {
		addr string
		why  string // "" for allowed; else a word of the reason
	}{
		{"0.0.0.0", "this network"}, {"0.255.255.255", "this network"},
		{"10.0.0.0", "RFC 1918"}, {"10.255.255.255", "RFC 1918"},
		{"100.64.0.0", "CGNAT"}, {"100.127.255.255", "CGNAT"}, {"100.100.100.200", "CGNAT"},
		{"127.0.0.1", "loopback"}, {"127.255.255.254", "loopback"}, {"127.0.0.2", "loopback"},
		{"169.254.0.1", "link-local"}, {"169.254.169.254", "link-local"}, {"169.254.170.2", "link-local"},
		{"172.16.0.0", "RFC 1918"}, {"172.31.255.255", "RFC 1918"},
		{"192.0.0.8", "IETF"}, {"192.0.2.1", "documentation"}, {"192.88.99.1", "6to4 relay"},
		{"192.168.0.1", "RFC 1918"}, {"192.168.255.255", "RFC 1918"},
		{"198.18.0.1", "benchmarking"}, {"198.19.255.255", "benchmarking"},
		{"198.51.100.7", "documentation"}, {"203.0.113.9", "documentation"},
		{"224.0.0.1", "multicast"}, {"239.255.255.250", "multicast"},
		{"240.0.0.1", "reserved"}, {"255.255.255.254", "reserved"}, {"255.255.255.255", "broadcast"},
		{"::", "unspecified"}, {"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"}, {"::ffff:10.1.2.3", "RFC 1918"}, {"::ffff:169.254.169.254", "link-local"},
		{"::127.0.0.1", "IPv4-compatible"}, {"::10.0.0.1", "IPv4-compatible"}, {"::2", "this network"}, {"::8.8.8.8", "IPv4-compatible"},
		{"::ffff:0:7f00:1", "IPv4-translated"},
		{"64:ff9b::7f00:1", "NAT64"}, {"64:ff9b::a9fe:a9fe", "NAT64"}, {"64:ff9b::c0a8:101", "NAT64"},
		{"64:ff9b:1::1", "local-use NAT64"}, {"64:ff9b:1:ffff::7f00:1", "local-use NAT64"},
		{"100::1", "discard"}, {"2001::1", "Teredo"}, {"2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"},
		{"2001:2::1", "benchmarking"}, {"2001:db8::1", "documentation"}, {"3fff::1", "documentation"},
		{"2002:7f00:1::", "6to4"}, {"2002:a9fe:a9fe::1", "6to4"}, {"2002:c0a8:101::1", "6to4"},
		{"5f00::1", "segment routing"},
		{"fc00::1", "unique local"}, {"fd00:ec2::254", "unique local"}, {"fdff:ffff::1", "unique local"},
		{"fe80::1", "link-local"}, {"febf:ffff::1", "link-local"}, {"fe80::1%eth0", "link-local"},
		{"fec0::1", "site-local"},
		{"ff02::1", "multicast"}, {"ff05::2", "multicast"},
		{"4000::1", "not global unicast"}, {"::ffff:1:2:3:4", "not global unicast"}, {"1::", "not global unicast"},
		// public, just outside the ranges above
		{"1.1.1.1", ""}, {"9.255.255.255", ""}, {"11.0.0.0", ""}, {"100.63.255.255", ""}, {"100.128.0.0", ""},
		{"126.255.255.255", ""}, {"128.0.0.0", ""}, {"169.253.255.255", ""}, {"169.255.0.0", ""},
		{"172.15.255.255", ""}, {"172.32.0.0", ""}, {"192.167.255.255", ""}, {"192.169.0.0", ""},
		{"198.17.255.255", ""}, {"198.20.0.0", ""}, {"223.255.255.255", ""},
		{"::ffff:8.8.8.8", ""}, {"64:ff9b::808:808", ""}, {"2002:808:808::1", ""},
		{"2606:4700::1111", ""}, {"2a00:1450:4001::1", ""}, {"2001:4860:4860::8888", ""},
	}
	for _, c := range cases {
		err := g.Check(netip.MustParseAddr(c.addr))
		var de *DeniedError
		switch {
		case c.why == "" && err != nil:
			t.Errorf("%s: %v (want allowed)", c.addr, err)
		case c.why != "" && !errors.As(err, &de):
			t.Errorf("%s: %v (want denied: %s)", c.addr, err, c.why)
		case c.why != "" && !strings.Contains(err.Error(), c.why):
			t.Errorf("%s: %v (want the reason to say %q)", c.addr, err, c.why)
		case c.why != "" && !strings.Contains(err.Error(), netip.MustParseAddr(c.addr).WithZone("").String()):
			t.Errorf("%s: %v (want the error to name the address)", c.addr, err)
		}
	}
}

// TestNumericTricks: every spelling of loopback and of the metadata address is read as a
// resolver reads it, and denied, with no lookup made.
func TestNumericTricks(t *testing.T) {
	r := &fakeResolver{}
	g := newGuard(t, Options{Resolver: r})
	cases := map[string]string{
		"127.0.0.1": "127.0.0.1", "127.0.0.1.": "127.0.0.1", "127.1": "127.0.0.1", "127.0.1": "127.0.0.1",
		"0x7f000001": "127.0.0.1", "0X7F000001": "127.0.0.1", "2130706433": "127.0.0.1", "017700000001": "127.0.0.1",
		"0177.0.0.1": "127.0.0.1", "0x7f.0.0.1": "127.0.0.1", "0x7f.1": "127.0.0.1", "127.0x0.0.01": "127.0.0.1",
		"127.000000000000000.0.1": "127.0.0.1", "0x00000000000007f.1": "127.0.0.1",
		"[::1]": "::1", "::1": "::1", "[::ffff:127.0.0.1]": "::ffff:127.0.0.1", "::ffff:127.0.0.1": "::ffff:127.0.0.1",
		"[::ffff:7f00:1]": "::ffff:127.0.0.1", "[0:0:0:0:0:ffff:127.0.0.1]": "::ffff:127.0.0.1",
		"0": "0.0.0.0", "0.0.0.0": "0.0.0.0", "0x0": "0.0.0.0", "0x": "0.0.0.0", "[::]": "::",
		"169.254.169.254": "169.254.169.254", "0xa9fea9fe": "169.254.169.254", "2852039166": "169.254.169.254",
		"0251.0376.0251.0376": "169.254.169.254", "169.254.43518": "169.254.169.254", "[::ffff:169.254.169.254]": "::ffff:169.254.169.254",
		"[fe80::1%25eth0]": "fe80::1%25eth0", "10.1": "10.0.0.1", "192.168.1": "192.168.0.1",
	}
	for host, want := range cases {
		a, name, err := ParseHost(host)
		if err != nil || name != "" || a != netip.MustParseAddr(want) {
			t.Errorf("ParseHost(%q) = %v, %q, %v; want %s", host, a, name, err, want)
		}
		got, err := g.Resolve(context.Background(), host)
		var de *DeniedError
		if !errors.As(err, &de) {
			t.Errorf("Resolve(%q) = %v, %v; want denied", host, got, err)
		}
	}
	if len(r.lookups) != 0 {
		t.Errorf("numeric hosts were looked up: %v", r.lookups)
	}
}

// TestParseHostRefusesAmbiguous: hosts that are not an address and not a clean name are
// refused before any lookup.
func TestParseHostRefusesAmbiguous(t *testing.T) {
	for _, host := range []string{
		"", "1.2.3.256", "256.1.1.1", "1.2.3.4.5", "0x100000000", "4294967296", "08.0.0.1", "127.0.0.1..",
		"127.0.0.1 ", "127.0.0.1\x00.example.com", "exa mple.com", "a..b", "[127.0.0.1]", "[::1", "::g",
		"example.123", "example.0x7f", "evil.com/x", "user@host", strings.Repeat("a", 300),
	} {
		if a, name, err := ParseHost(host); err == nil {
			t.Errorf("ParseHost(%q) = %v, %q; want an error", host, a, name)
		}
	}
	for host, want := range map[string]string{"Example.COM.": "example.com", "pypi.org": "pypi.org", "_srv.x-y.io": "_srv.x-y.io", "1e100.net": "1e100.net"} {
		if a, name, err := ParseHost(host); err != nil || a.IsValid() || name != want {
			t.Errorf("ParseHost(%q) = %v, %q, %v; want the name %q", host, a, name, err, want)
		}
	}
}

// TestResolveChecksEveryAddress: one denied address among the answers refuses the host, and
// the error names it; localhost names are loopback without asking the resolver.
func TestResolveChecksEveryAddress(t *testing.T) {
	r := &fakeResolver{answers: map[string][][]netip.Addr{
		"public.test":   {addrs("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")},
		"mixed.test":    {addrs("93.184.215.14", "10.0.0.7")},
		"metadata.test": {addrs("169.254.169.254")},
		"mapped.test":   {addrs("::ffff:127.0.0.1")},
		"empty.test":    {{}},
	}}
	g := newGuard(t, Options{Resolver: r})
	ctx := context.Background()
	got, err := g.Resolve(ctx, "public.test")
	if err != nil || len(got) != 2 {
		t.Fatalf("public.test: %v %v", got, err)
	}
	for host, want := range map[string]string{"mixed.test": "10.0.0.7", "metadata.test": "169.254.169.254", "mapped.test": "127.0.0.1", "localhost": "::1", "a.b.localhost": "::1", "LOCALHOST.": "::1"} {
		_, err := g.Resolve(ctx, host)
		var de *DeniedError
		if !errors.As(err, &de) || de.Addr.String() != want || !strings.Contains(err.Error(), host) {
			t.Errorf("%s: %v; want a denial naming %s and the host", host, err, want)
		}
	}
	if _, err := g.Resolve(ctx, "empty.test"); err == nil {
		t.Error("a name with no addresses resolved")
	}
	if _, err := g.Resolve(ctx, "nxdomain.test"); err == nil || !strings.Contains(err.Error(), "nxdomain.test") {
		t.Errorf("an unknown name: %v", err)
	}
	if r.lookups["localhost"]+r.lookups["a.b.localhost"] != 0 {
		t.Error("localhost was looked up")
	}
}

// TestDialNoRebinding: DialContext resolves once and dials the checked address; a name whose
// second answer is loopback is never dialled there.
func TestDialNoRebinding(t *testing.T) {
	r := &fakeResolver{answers: map[string][][]netip.Addr{
		"rebind.test": {addrs("93.184.215.14"), addrs("127.0.0.1")},
	}}
	d := &fakeDialer{}
	g := newGuard(t, Options{Resolver: r, Dialer: d})
	ctx := context.Background()
	c, err := g.DialContext(ctx, "tcp", "rebind.test:443")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if r.lookups["rebind.test"] != 1 || len(d.dialed) != 1 || d.dialed[0] != "tcp 93.184.215.14:443" {
		t.Fatalf("lookups %v, dialed %v; want one lookup and the checked address dialled", r.lookups, d.dialed)
	}
	// The next connection asks again, gets loopback, and is refused before any dial.
	if _, err := g.DialContext(ctx, "tcp", "rebind.test:443"); err == nil {
		t.Fatal("the rebound name was dialled")
	}
	for _, addr := range []string{"127.0.0.1:6379", "[::1]:6379", "[::ffff:127.0.0.1]:6379", "0x7f000001:6379", "2130706433:6379", "127.1:6379", "localhost:6379", "169.254.169.254:80", "0xa9fea9fe:80"} {
		if _, err := g.DialContext(ctx, "tcp", addr); err == nil {
			t.Errorf("%s was dialled", addr)
		}
	}
	for _, addr := range []string{"93.184.215.14:0", "93.184.215.14:x", "93.184.215.14", "93.184.215.14:65536"} {
		if _, err := g.DialContext(ctx, "tcp", addr); err == nil {
			t.Errorf("%s was dialled", addr)
		}
	}
	if _, err := g.DialContext(ctx, "udp", "93.184.215.14:53"); err == nil {
		t.Error("udp was dialled")
	}
	if len(d.dialed) != 1 {
		t.Fatalf("dialed %v", d.dialed)
	}
}

// TestAllowPrefixes: an operator prefix opens a private range (and its mapped forms) but
// not loopback unless it lies inside loopback, never the unspecified range, and never a
// platform address.
func TestAllowPrefixes(t *testing.T) {
	allow, err := ParsePrefixes([]string{"10.1.0.0/16", "0.0.0.0/0", "fd00:1::/64", "127.0.0.2", "::ffff:192.168.7.0/120"})
	if err != nil {
		t.Fatal(err)
	}
	g := newGuard(t, Options{Allow: allow})
	g.SetDenied("redis", addrs("10.1.0.5", "127.0.0.2"))
	for _, c := range []struct {
		addr string
		ok   bool
	}{
		{"10.1.2.3", true}, {"::ffff:10.1.2.3", true}, {"64:ff9b::a01:203", true}, {"fd00:1::5", true}, {"fd00:2::5", false},
		{"192.168.7.9", true}, {"172.16.0.1", true}, // 0.0.0.0/0 opens the private IPv4 ranges …
		{"127.0.0.1", false}, {"::ffff:127.0.0.1", false}, {"::1", false}, // … but not loopback,
		{"0.0.0.0", false}, {"0.1.2.3", false}, {"::", false}, // never the unspecified range,
		{"10.1.0.5", false}, {"::ffff:10.1.0.5", false}, {"127.0.0.2", false}, // nor the platform's addresses
	} {
		if err := g.Check(netip.MustParseAddr(c.addr)); (err == nil) != c.ok {
			t.Errorf("%s: %v (want allowed=%v)", c.addr, err, c.ok)
		}
	}
	lo := newGuard(t, Options{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}})
	for _, a := range []string{"127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"} {
		if err := lo.Check(netip.MustParseAddr(a)); err != nil {
			t.Errorf("with loopback allowed explicitly, %s: %v", a, err)
		}
	}
	if _, err := ParsePrefixes([]string{"10.0.0.0/33"}); err == nil {
		t.Error("a bad prefix parsed")
	}
}

// TestPlatformAddresses: SetDenied replaces a source's addresses; a public address of the
// platform is denied, and named as the platform's, its source only in the operator's log.
func TestPlatformAddresses(t *testing.T) {
	var logged bytes.Buffer
	g := newGuard(t, Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	pub := netip.MustParseAddr("93.184.215.14")
	g.SetDenied("nodes", []netip.Addr{pub})
	err := g.Check(pub)
	var de *DeniedError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "an address of the platform itself") ||
		strings.Contains(err.Error(), "nodes") || de.Source != "nodes" {
		t.Fatalf("a node's public address: %v (source %q); want it denied as the platform's, the source out of the text", err, de.Source)
	}
	if !strings.Contains(logged.String(), "source=nodes") || !strings.Contains(logged.String(), pub.String()) {
		t.Fatalf("the operator's log %q does not name the source and the address", logged.String())
	}
	if err := g.Check(netip.MustParseAddr("::ffff:93.184.215.14")); err == nil {
		t.Fatal("a node's address in IPv4-mapped form was allowed")
	}
	g.SetDenied("nodes", nil)
	if err := g.Check(pub); err != nil {
		t.Fatalf("after the node left: %v", err)
	}
}

// TestForms: the forms a rule about an address must match.
func TestForms(t *testing.T) {
	for in, want := range map[string]string{
		"169.254.169.254": "169.254.169.254", "::ffff:169.254.169.254": "169.254.169.254",
		"64:ff9b::a9fe:a9fe": "64:ff9b::a9fe:a9fe 169.254.169.254", "2002:a9fe:a9fe::": "2002:a9fe:a9fe:: 169.254.169.254",
		"fd00:ec2::254": "fd00:ec2::254",
	} {
		var got []string
		for _, a := range Forms(netip.MustParseAddr(in)) {
			got = append(got, a.String())
		}
		if strings.Join(got, " ") != want {
			t.Errorf("Forms(%s) = %v; want %s", in, got, want)
		}
	}
}

// serverResolver fails every lookup as a real resolver does, naming its DNS server.
type serverResolver struct{}

func (serverResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return nil, &net.DNSError{Err: "no such host", Name: host, Server: "10.255.255.53:53", IsNotFound: true}
}

// TestErrorsNameNoInternalAddress: what a refusal tells a tenant names neither the platform's
// DNS server nor which of its components an address belongs to.
func TestErrorsNameNoInternalAddress(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, Options{Resolver: serverResolver{}, Dialer: &fakeDialer{}, Logger: slog.New(slog.DiscardHandler)})
	for name, do := range map[string]func() error{
		"Resolve":     func() error { _, err := g.Resolve(ctx, "gone.test"); return err },
		"Lookup":      func() error { _, err := g.Lookup(ctx, "gone.test"); return err },
		"DialContext": func() error { _, err := g.DialContext(ctx, "tcp", "gone.test:443"); return err },
	} {
		err := do()
		var de *net.DNSError
		if !errors.As(err, &de) || !de.IsNotFound || !strings.Contains(err.Error(), "gone.test") || strings.Contains(err.Error(), "10.255.255.53") {
			t.Errorf("%s: %v; want a not-found DNSError naming the host and not the DNS server", name, err)
		}
	}

	platform := []struct{ src, addr, host string }{
		{"redis", "10.1.0.5", "cache.test"}, {"nodes", "93.184.215.14", "node.test"},
		{"gateways", "2606:4700::1111", "gw.test"}, {"this host's interfaces", "192.0.2.10", "self.test"},
	}
	r := &fakeResolver{answers: map[string][][]netip.Addr{}}
	pg := newGuard(t, Options{Resolver: r, Logger: slog.New(slog.DiscardHandler)})
	for _, p := range platform {
		pg.SetDenied(p.src, addrs(p.addr))
		r.answers[p.host] = [][]netip.Addr{addrs(p.addr)}
	}
	for _, p := range platform {
		_, err := pg.Resolve(ctx, p.host)
		var de *DeniedError
		if !errors.As(err, &de) || de.Source != p.src || !strings.Contains(err.Error(), "an address of the platform itself") {
			t.Errorf("%s (%s): %v; want it denied as the platform's", p.host, p.src, err)
			continue
		}
		for _, word := range []string{"redis", "nodes", "gateways", "interfaces"} {
			if strings.Contains(err.Error(), word) {
				t.Errorf("%s: %q names %q", p.host, err, word)
			}
		}
	}
}

// TestPlatformWarningsAreBounded: the operator's line for each refusal of a platform address
// keeps to a budget for each source (logbudget), and a line says how many were dropped: a
// guest whose policy allows egress may ask for a node's address in a loop, thousands of times
// a second, and each attempt logged a line.
func TestPlatformWarningsAreBounded(t *testing.T) {
	var logged syncbuf.Buffer
	g := newGuard(t, Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	pub := netip.MustParseAddr("93.184.215.14")
	g.SetDenied("nodes", []netip.Addr{pub})
	start := time.Now()
	const attempts = 10_000
	for range attempts {
		if g.Check(pub) == nil {
			t.Fatal("a node's address was allowed")
		}
	}
	took := time.Since(start)
	kept := strings.Count(logged.String(), "refused a connection to an address of the platform")
	most := logbudget.Burst + int(2*took.Seconds()*logbudget.Rate) + 1
	if kept > most {
		t.Errorf("%d refusals in %s logged %d lines, want at most %d (%s)", attempts, took.Round(time.Millisecond), kept, most, logbudget.Limits())
	}
	if kept == 0 || !strings.Contains(logged.String(), "were dropped") {
		t.Errorf("%d lines of refusals, and no line says that some were dropped", kept)
	}
}
