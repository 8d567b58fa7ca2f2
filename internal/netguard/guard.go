package netguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"wb/internal/logbudget"
)

// Resolver looks a name up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer opens a connection to a numeric address; *net.Dialer is one.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Options configure a Guard. Zero values take the defaults.
type Options struct {
	// Allow lists the operator's prefixes that open otherwise denied ranges (see the package
	// documentation for loopback and the unspecified range).
	Allow []netip.Prefix
	// Resolver looks names up (default net.DefaultResolver).
	Resolver Resolver
	// Dialer dials checked addresses (default a net.Dialer with a 10 s timeout).
	Dialer Dialer
	// Logger is the operator's log, which names the source of a refused platform address
	// (default slog.Default()).
	Logger *slog.Logger
}

// Guard decides, resolves and dials. Safe for concurrent use; only SetDenied changes what it
// decides.
type Guard struct {
	allow         []netip.Prefix
	allowLoopback []netip.Prefix // the allow prefixes that lie inside loopback
	resolver      Resolver
	dialer        Dialer
	log           *slog.Logger

	mu       sync.RWMutex
	platform map[string][]netip.Addr // source → addresses, always denied

	// warns bounds the operator's lines about refused platform addresses, for each source: a
	// guest may ask for one in a loop, thousands of times a second.
	warns logbudget.Budget
}

var loopbackV4 = netip.MustParsePrefix("127.0.0.0/8")

// New returns a Guard.
func New(o Options) (*Guard, error) {
	g := &Guard{resolver: o.Resolver, dialer: o.Dialer, log: o.Logger, platform: map[string][]netip.Addr{}}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.resolver == nil {
		g.resolver = net.DefaultResolver
	}
	if g.dialer == nil {
		g.dialer = &net.Dialer{Timeout: 10 * time.Second}
	}
	for _, p := range o.Allow {
		if !p.IsValid() {
			return nil, fmt.Errorf("allow prefix %v is not valid", p)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		p = p.Masked()
		g.allow = append(g.allow, p)
		if (p.Addr().Is4() && p.Bits() >= 8 && loopbackV4.Contains(p.Addr())) || p == netip.PrefixFrom(netip.IPv6Loopback(), 128) {
			g.allowLoopback = append(g.allowLoopback, p)
		}
	}
	return g, nil
}

// ParsePrefixes reads allow prefixes as an operator writes them: "10.1.0.0/16", "fd00::/8",
// or a single address ("10.1.2.3").
func ParsePrefixes(values []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(values))
	for _, v := range values {
		v = strings.TrimSpace(v)
		if a, err := netip.ParseAddr(v); err == nil {
			out = append(out, netip.PrefixFrom(a.WithZone(""), a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR prefix (like 10.1.0.0/16 or fd00:1::/64) or an address", v)
		}
		out = append(out, p)
	}
	return out, nil
}

// SetDenied replaces the platform addresses known from source ("interfaces", "redis",
// "nodes", "gateways", …): they are denied whatever the allow prefixes say.
func (g *Guard) SetDenied(source string, addrs []netip.Addr) {
	norm := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			norm = append(norm, a.WithZone("").Unmap())
		}
	}
	g.mu.Lock()
	g.platform[source] = norm
	g.mu.Unlock()
}

// Denied lists the platform addresses by source, for logs and tests.
func (g *Guard) Denied() map[string][]netip.Addr {
	g.mu.RLock()
	defer g.mu.RUnlock()
	out := make(map[string][]netip.Addr, len(g.platform))
	for k, v := range g.platform {
		out[k] = slices.Clone(v)
	}
	return out
}

// DeniedError is an address the guard refuses. Its text reaches tenants.
type DeniedError struct {
	Host   string     // as asked for; empty when the caller gave an address
	Addr   netip.Addr // the address refused
	Reason string
	// Source is the SetDenied source of a platform address ("redis", "nodes", …), for the
	// operator only: the text says no more than that the address is the platform's, since
	// a tenant must not learn which of its components lives where.
	Source string
}

func (e *DeniedError) Error() string {
	if e.Host != "" && e.Host != e.Addr.String() {
		return fmt.Sprintf("%s resolves to %s, which wb does not connect to: %s", e.Host, e.Addr, e.Reason)
	}
	return fmt.Sprintf("wb does not connect to %s: %s", e.Addr, e.Reason)
}

// Check says whether a may be dialled: nil, or a *DeniedError that names why.
func (g *Guard) Check(a netip.Addr) error {
	if !a.IsValid() {
		return &DeniedError{Addr: a, Reason: "not an IP address"}
	}
	a = a.WithZone("")
	forms := Forms(a)
	g.mu.RLock()
	for _, f := range forms {
		for src, addrs := range g.platform {
			if slices.Contains(addrs, f) {
				g.mu.RUnlock()
				ok, dropped := g.warns.Take(src, time.Now())
				if dropped > 0 {
					g.log.Warn("refusals of the platform's addresses are more than the log's budget; lines of them were dropped",
						"source", src, "dropped", dropped, "budget", logbudget.Limits())
				}
				if ok {
					g.log.Warn("refused a connection to an address of the platform", "addr", a, "source", src)
				}
				return &DeniedError{Addr: a, Reason: "an address of the platform itself", Source: src}
			}
		}
	}
	g.mu.RUnlock()
	return g.checkRange(a, a)
}

// checkRange applies the deny list and the allow prefixes to a (orig as asked).
func (g *Guard) checkRange(orig, a netip.Addr) error {
	s := classify(a)
	if s.embed != nil {
		v4 := s.embed(a)
		if err := g.checkRange(orig, v4); err != nil {
			var de *DeniedError
			if errors.As(err, &de) {
				return &DeniedError{Addr: orig, Reason: fmt.Sprintf("%s form of %s, %s", s.why, v4, de.Reason)}
			}
			return err
		}
	}
	switch s.kind {
	case public, embedsIPv4:
		return nil
	case denied:
		if containsAny(g.allow, a) {
			return nil
		}
	case loopbackOnly:
		if containsAny(g.allowLoopback, a) {
			return nil
		}
	}
	return &DeniedError{Addr: orig, Reason: s.why}
}

func containsAny(ps []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
}

// Resolve looks host up once (a numeric host needs no lookup; see ParseHost) and checks
// every address it answers: if any is denied, the whole host is, with a *DeniedError naming
// the address. The addresses are returned in the resolver's order, IPv4-mapped ones as IPv4.
func (g *Guard) Resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	return g.resolve(ctx, "ip", host)
}

func (g *Guard) resolve(ctx context.Context, network, host string) ([]netip.Addr, error) {
	addrs, err := g.lookup(ctx, network, host)
	if err != nil {
		return nil, err
	}
	if err := g.CheckAll(host, addrs); err != nil {
		return nil, err
	}
	return addrs, nil
}

// CheckAll checks every address host resolved to: nil, or the first denial, naming host.
func (g *Guard) CheckAll(host string, addrs []netip.Addr) error {
	if len(addrs) == 0 {
		return fmt.Errorf("%s: no address to check", host)
	}
	for _, a := range addrs {
		if err := g.Check(a); err != nil {
			var de *DeniedError
			if errors.As(err, &de) {
				de.Host = host
			}
			return err
		}
	}
	return nil
}

// Lookup resolves host once, the way Resolve does, without checking the answer: for a
// caller that must see the addresses (to put them to a policy) before CheckAll refuses
// them. A localhost name answers ::1 and 127.0.0.1 without a lookup (RFC 6761).
func (g *Guard) Lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return g.lookup(ctx, "ip", host)
}

func (g *Guard) lookup(ctx context.Context, network, host string) ([]netip.Addr, error) {
	a, name, err := ParseHost(host)
	if err != nil {
		return nil, err
	}
	switch {
	case a.IsValid():
		return []netip.Addr{a.WithZone("")}, nil
	case name == "localhost" || strings.HasSuffix(name, ".localhost"):
		return []netip.Addr{netip.IPv6Loopback(), netip.AddrFrom4([4]byte{127, 0, 0, 1})}, nil
	}
	got, err := g.resolver.LookupNetIP(ctx, network, name)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", name, withoutServer(err))
	}
	var addrs []netip.Addr
	for _, a := range got {
		a = a.WithZone("").Unmap()
		if a.IsValid() && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s: no addresses", name)
	}
	return addrs, nil
}

// withoutServer drops the DNS server from a lookup's error ("lookup x on 10.0.0.2:53: …"):
// the text reaches tenants, and the server is an internal address.
func withoutServer(err error) error {
	var de *net.DNSError
	if !errors.As(err, &de) || de.Server == "" {
		return err
	}
	c := *de
	c.Server = ""
	return &c
}

// DialAddrs connects to port on the first of addrs that answers, each checked again just
// before it is dialled (the platform's addresses may have changed since they were
// resolved). It never resolves anything.
func (g *Guard) DialAddrs(ctx context.Context, network string, addrs []netip.Addr, port uint16) (net.Conn, error) {
	if port == 0 {
		return nil, errors.New("port 0 cannot be dialled")
	}
	if len(addrs) == 0 {
		return nil, errors.New("no address to dial")
	}
	var errs []error
	for _, a := range addrs {
		if err := g.Check(a); err != nil {
			return nil, err
		}
		if (network == "tcp4" && !a.Is4()) || (network == "tcp6" && !a.Is6()) {
			continue
		}
		c, err := g.dialer.DialContext(ctx, network, netip.AddrPortFrom(a, port).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("no %s address among %v", network, addrs)
	}
	return nil, errors.Join(errs...)
}

// DialContext resolves and checks address ("host:port") once, then dials a checked address;
// it can stand in for net.Dialer.DialContext, in an http.Transport for one.
func (g *Guard) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", address, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("address %q: the port must be 1–65535", address)
	}
	lookup := "ip"
	switch network {
	case "tcp4":
		lookup = "ip4"
	case "tcp6":
		lookup = "ip6"
	case "tcp":
	default:
		return nil, fmt.Errorf("network %q: only tcp is dialled", network)
	}
	addrs, err := g.resolve(ctx, lookup, host)
	if err != nil {
		return nil, err
	}
	return g.DialAddrs(ctx, network, addrs, uint16(port))
}

// MaxResponseHeaderBytes bounds the response headers a Transport reads. The server at the
// other end is a tenant's, and Go's default (10 MiB) would let it make wb hold that much per
// request; a webhook receiver's answer needs a few hundred bytes of headers.
const MaxResponseHeaderBytes = 64 << 10

// Transport is an http.Transport that dials only through g, uses no proxy from the
// environment (a proxy would dial on its own terms) and reads at most
// MaxResponseHeaderBytes of response headers.
func (g *Guard) Transport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = g.DialContext
	t.MaxResponseHeaderBytes = MaxResponseHeaderBytes
	return t
}
