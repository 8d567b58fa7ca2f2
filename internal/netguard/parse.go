package netguard

import (
	"fmt"
	"net/netip"
	"strings"
)

// HostError is a host that is neither an address nor a well-formed name.
type HostError struct {
	Host   string
	Reason string
}

func (e *HostError) Error() string { return fmt.Sprintf("host %q: %s", e.Host, e.Reason) }

// maxHostLen is a DNS name's limit (253), with room for a trailing dot.
const maxHostLen = 254

// ParseHost reads host as a resolver would. A numeric host (a bare or bracketed IPv6 address,
// or an IPv4 address in any form inet_aton(3) accepts: "127.1", "0x7f000001", "2130706433",
// "0177.0.0.1", with or without a trailing dot) yields its address; any other host yields
// its name in lower case without a trailing dot. A host whose last label is a number but
// which is not a valid IPv4 address ("1.2.3.256") is refused, as URL parsers refuse it,
// rather than handed to a resolver that might read it differently.
func ParseHost(host string) (netip.Addr, string, error) {
	bad := func(reason string) (netip.Addr, string, error) {
		return netip.Addr{}, "", &HostError{Host: host, Reason: reason}
	}
	switch {
	case host == "":
		return bad("is empty")
	case len(host) > maxHostLen:
		return bad(fmt.Sprintf("is longer than %d characters", maxHostLen))
	case strings.HasPrefix(host, "["):
		inner, ok := strings.CutSuffix(host[1:], "]")
		a, err := netip.ParseAddr(inner)
		if !ok || err != nil || !a.Is6() {
			return bad("is not a valid bracketed IPv6 address")
		}
		return a, "", nil
	case strings.Contains(host, ":"):
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return bad("is not a valid IPv6 address")
		}
		return a, "", nil
	}
	t := strings.TrimSuffix(host, ".")
	if a, ok := parseIPv4(t); ok {
		return a, "", nil
	}
	labels := strings.Split(t, ".")
	if looksNumeric(labels[len(labels)-1]) {
		return bad("ends in a number but is not a valid IPv4 address")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return bad("has an empty label or one longer than 63 characters")
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return bad(fmt.Sprintf("has the character %q; a name has letters, digits, '-', '_' and dots (IDNs in punycode)", c))
			}
		}
	}
	return netip.Addr{}, strings.ToLower(t), nil
}

// parseIPv4 is inet_aton(3): one to four parts separated by dots, each decimal, octal (a
// leading 0) or hexadecimal (0x); the last part fills the bytes the others leave
// ("127.1" is 127.0.0.1, "2130706433" is 127.0.0.1).
func parseIPv4(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint32, len(parts))
	for i, p := range parts {
		v, ok := parseInetNumber(p)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	last := len(vals) - 1
	var ip uint32
	for i, v := range vals[:last] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		ip |= v << (24 - 8*i)
	}
	if rest := uint(8 * (4 - last)); rest < 32 && vals[last] >= 1<<rest {
		return netip.Addr{}, false
	}
	ip |= vals[last]
	return netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), true
}

// parseInetNumber reads one part of an inet_aton address: "0x…" hexadecimal ("0x" alone is
// 0, as glibc reads it), "0…" octal, else decimal; at most 32 bits.
func parseInetNumber(p string) (uint32, bool) {
	base, digits := uint64(10), p
	switch {
	case len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X'):
		base, digits = 16, p[2:]
		if digits == "" {
			return 0, true
		}
	case len(p) >= 2 && p[0] == '0':
		base, digits = 8, p[1:]
	case p == "":
		return 0, false
	}
	var v uint64
	for _, c := range []byte(digits) {
		var d uint64
		switch {
		case c >= '0' && c <= '9':
			d = uint64(c - '0')
		case c >= 'a' && c <= 'f':
			d = uint64(c-'a') + 10
		case c >= 'A' && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			return 0, false
		}
		if d >= base {
			return 0, false
		}
		if v = v*base + d; v > 0xffffffff {
			return 0, false
		}
	}
	return uint32(v), true
}

// looksNumeric: a label that URL parsers treat as the end of an IPv4 address (decimal, or
// 0x and hex digits).
func looksNumeric(l string) bool {
	if l == "" {
		return false
	}
	if h, ok := strings.CutPrefix(strings.ToLower(l), "0x"); ok {
		return strings.Trim(h, "0123456789abcdef") == ""
	}
	return strings.Trim(l, "0123456789") == ""
}
