package netguard

import "net/netip"

// kind is what the platform deny list does with the addresses of one range.
type kind int

const (
	public       kind = iota // globally reachable: allowed
	denied                   // not public; an operator allow prefix covering the address opens it
	loopbackOnly             // loopback; opened only by an allow prefix that lies inside it
	never                    // reaches the host itself: no setting opens it
	embedsIPv4               // carries an IPv4 address, which decides
)

// special is one row of the platform's address table.
type special struct {
	prefix netip.Prefix
	kind   kind
	why    string
	embed  func(netip.Addr) netip.Addr // for a form that carries an IPv4 address: that address, checked first
}

// lastFour is the IPv4 address in the low 32 bits (IPv4-mapped, -compatible, -translated, NAT64).
func lastFour(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom4([4]byte(b[12:16]))
}

// sixToFour is the IPv4 address in bits 16–47 of a 6to4 address (RFC 3056).
func sixToFour(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom4([4]byte(b[2:6]))
}

// table follows IANA's IPv4 and IPv6 special-purpose address registries: every range not
// marked globally reachable is denied. The longest matching prefix decides, so the two
// catch-all rows (0.0.0.0/0 public, ::/0 denied with 2000::/3 public) only apply where no
// special range does.
var table = func() []special {
	p := netip.MustParsePrefix
	return []special{
		{prefix: p("0.0.0.0/0"), kind: public},
		{prefix: p("0.0.0.0/8"), kind: never, why: "this network (0.0.0.0/8), which reaches the host itself"},
		{prefix: p("10.0.0.0/8"), kind: denied, why: "private (10.0.0.0/8, RFC 1918)"},
		{prefix: p("100.64.0.0/10"), kind: denied, why: "shared address space, CGNAT (100.64.0.0/10, RFC 6598)"},
		{prefix: p("127.0.0.0/8"), kind: loopbackOnly, why: "loopback (127.0.0.0/8)"},
		{prefix: p("169.254.0.0/16"), kind: denied, why: "link-local (169.254.0.0/16), where cloud metadata lives"},
		{prefix: p("172.16.0.0/12"), kind: denied, why: "private (172.16.0.0/12, RFC 1918)"},
		{prefix: p("192.0.0.0/24"), kind: denied, why: "IETF protocol assignments (192.0.0.0/24)"},
		{prefix: p("192.0.2.0/24"), kind: denied, why: "documentation (192.0.2.0/24)"},
		{prefix: p("192.88.99.0/24"), kind: denied, why: "6to4 relay anycast (192.88.99.0/24, deprecated)"},
		{prefix: p("192.168.0.0/16"), kind: denied, why: "private (192.168.0.0/16, RFC 1918)"},
		{prefix: p("198.18.0.0/15"), kind: denied, why: "benchmarking (198.18.0.0/15)"},
		{prefix: p("198.51.100.0/24"), kind: denied, why: "documentation (198.51.100.0/24)"},
		{prefix: p("203.0.113.0/24"), kind: denied, why: "documentation (203.0.113.0/24)"},
		{prefix: p("224.0.0.0/4"), kind: denied, why: "multicast (224.0.0.0/4)"},
		{prefix: p("240.0.0.0/4"), kind: denied, why: "reserved (240.0.0.0/4)"},
		{prefix: p("255.255.255.255/32"), kind: denied, why: "broadcast (255.255.255.255)"},

		{prefix: p("::/0"), kind: denied, why: "not global unicast (outside 2000::/3)"},
		{prefix: p("2000::/3"), kind: public},
		{prefix: p("::/128"), kind: never, why: "unspecified (::), which reaches the host itself"},
		{prefix: p("::1/128"), kind: loopbackOnly, why: "loopback (::1)"},
		// Deprecated (RFC 4291) and never routed: denied even when what it carries is public.
		{prefix: p("::/96"), kind: denied, why: "IPv4-compatible (::/96, deprecated)", embed: lastFour},
		{prefix: p("::ffff:0:0/96"), kind: embedsIPv4, why: "IPv4-mapped (::ffff:0:0/96)", embed: lastFour},
		{prefix: p("::ffff:0:0:0/96"), kind: embedsIPv4, why: "IPv4-translated (::ffff:0:0:0/96)", embed: lastFour},
		{prefix: p("64:ff9b::/96"), kind: embedsIPv4, why: "NAT64 (64:ff9b::/96)", embed: lastFour},
		// Local-use NAT64 prefixes may embed the IPv4 address at any of RFC 6052's offsets, so
		// the address cannot be known: the whole range is denied.
		{prefix: p("64:ff9b:1::/48"), kind: denied, why: "local-use NAT64 (64:ff9b:1::/48)"},
		{prefix: p("100::/64"), kind: denied, why: "discard-only (100::/64)"},
		{prefix: p("2001::/32"), kind: denied, why: "Teredo (2001::/32), which tunnels to an embedded IPv4 address"},
		{prefix: p("2001:2::/48"), kind: denied, why: "benchmarking (2001:2::/48)"},
		{prefix: p("2001:db8::/32"), kind: denied, why: "documentation (2001:db8::/32)"},
		{prefix: p("2002::/16"), kind: embedsIPv4, why: "6to4 (2002::/16)", embed: sixToFour},
		{prefix: p("3fff::/20"), kind: denied, why: "documentation (3fff::/20)"},
		{prefix: p("5f00::/16"), kind: denied, why: "segment routing SIDs (5f00::/16)"},
		{prefix: p("fc00::/7"), kind: denied, why: "unique local (fc00::/7)"},
		{prefix: p("fe80::/10"), kind: denied, why: "link-local (fe80::/10)"},
		{prefix: p("fec0::/10"), kind: denied, why: "site-local (fec0::/10, deprecated)"},
		{prefix: p("ff00::/8"), kind: denied, why: "multicast (ff00::/8)"},
	}
}()

// classify returns the table's row for a: the longest prefix that contains it.
func classify(a netip.Addr) special {
	best := special{prefix: netip.Prefix{}, kind: never, why: "not an IP address"}
	bits := -1
	for _, s := range table {
		if s.prefix.Bits() > bits && s.prefix.Contains(a) {
			best, bits = s, s.prefix.Bits()
		}
	}
	return best
}

// Forms is a and, when a carries an IPv4 address (IPv4-mapped, -compatible, -translated,
// NAT64, 6to4), that IPv4 address: every form under which a rule about a must match. An
// IPv4-mapped address is given as its IPv4 address only.
func Forms(a netip.Addr) []netip.Addr {
	a = a.WithZone("")
	if a.Is4In6() {
		return []netip.Addr{a.Unmap()}
	}
	if s := classify(a); s.embed != nil {
		return []netip.Addr{a, s.embed(a)}
	}
	return []netip.Addr{a}
}
