// Package netguard decides whether wb may open a connection to an address on behalf of a
// tenant or a guest: the node's egress proxy and webhook deliveries both dial through a
// Guard, and nothing else decides.
//
// A Guard resolves a host once, checks every address it got, and dials exactly the checked
// address, so a name that answers with a public address to the check and a private one to
// the dial (DNS rebinding) gains nothing. Numeric hosts are parsed the way inet_aton(3) and
// getaddrinfo(3) would ("0x7f000001", "2130706433", "127.1", "0177.0.0.1", "127.0.0.1.",
// "[::ffff:127.0.0.1]"), so a spelling can never smuggle an address past the check.
//
// Three layers decide, in this order:
//
//  1. Platform addresses (Guard.SetDenied): the node's own interface addresses, Redis, the
//     gateways and the other nodes. Always denied; no setting opens them.
//  2. Operator allow prefixes (Options.Allow, `--egress-allow-cidr`): open chosen
//     non-public ranges, for a private service the guests are meant to reach. Loopback opens
//     only for a prefix that lies inside loopback (127.0.0.0/8 or ::1/128, written out on
//     purpose; 0.0.0.0/0 does not open it), and the unspecified/this-network range
//     (0.0.0.0/8, ::) never opens: connecting to it reaches the host itself.
//  3. The platform deny list (see ranges.go): every range that is not globally reachable in
//     IANA's special-purpose registries: loopback, unspecified, RFC 1918, CGNAT, link-local,
//     ULA, multicast, broadcast, documentation, benchmarking, reserved, Teredo and local-use
//     NAT64. An address that embeds an IPv4 address (IPv4-mapped, IPv4-compatible,
//     IPv4-translated, NAT64 64:ff9b::/96, 6to4) is checked again as that IPv4 address.
//
// No tenant policy can lift any of it: callers ask their policy first and the Guard after.
// The resolver and the dialer are interfaces, so tests prove every range without a packet
// leaving loopback.
package netguard
