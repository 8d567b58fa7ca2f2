package netguard

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
)

// notPublic is an independent oracle: the standard library's own idea of non-public
// addresses, plus the ranges it has no predicate for.
func notPublic(a netip.Addr) bool {
	a = a.WithZone("").Unmap()
	extra := []string{"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "198.18.0.0/15", "240.0.0.0/4", "::/96", "64:ff9b:1::/48", "2001::/32"}
	for _, p := range extra {
		if netip.MustParsePrefix(p).Contains(a) {
			return true
		}
	}
	return a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified()
}

// FuzzCheck: whatever the host, Resolve (with a resolver that knows no names, so only
// numeric hosts give addresses) never answers an address that is not public, and never
// panics; an address it allows is allowed under all its forms.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		"127.0.0.1", "127.1", "0x7f000001", "2130706433", "0177.0.0.1", "127.0.0.1.", "[::ffff:127.0.0.1]",
		"::ffff:127.0.0.1", "[::1]", "::1", "0", "0x", "0.0.0.0", "[::]", "169.254.169.254", "0xa9fea9fe",
		"2852039166", "[::ffff:169.254.169.254]", "[64:ff9b::a9fe:a9fe]", "[2002:7f00:1::]", "[::127.0.0.1]",
		"[fe80::1%eth0]", "10.1", "192.168.1", "100.64.0.1", "1.1.1.1", "8.8.8.8", "[2606:4700::1111]",
		"1.2.3.256", "0x100000000", "08.0.0.1", "localhost", "example.com", "[::ffff:0:7f00:1]",
	} {
		f.Add(s)
	}
	g, err := New(Options{Resolver: &fakeResolver{}, Dialer: &fakeDialer{}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, host string) {
		got, err := g.Resolve(context.Background(), host)
		if err != nil {
			return
		}
		for _, a := range got {
			for _, form := range Forms(a) {
				if notPublic(form) {
					t.Fatalf("Resolve(%q) allowed %s (form %s), which is not public", host, a, form)
				}
				if err := g.Check(form); err != nil {
					t.Fatalf("Resolve(%q) allowed %s but not its form %s: %v", host, a, form, err)
				}
			}
		}
	})
}

// FuzzIPv4Spellings: any IPv4 address written in any inet_aton spelling parses back to
// itself, and its verdict does not depend on the spelling.
func FuzzIPv4Spellings(f *testing.F) {
	f.Add(uint32(0x7f000001), uint8(0), uint8(0))
	f.Add(uint32(0xa9fea9fe), uint8(3), uint8(1))
	f.Add(uint32(0x08080808), uint8(2), uint8(2))
	g, err := New(Options{Resolver: &fakeResolver{}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ip uint32, parts, base uint8) {
		want := netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)})
		n := int(parts%4) + 1
		// The first n-1 parts are one byte each; the last holds the rest.
		var vals []uint64
		for i := range n - 1 {
			vals = append(vals, uint64(ip>>(24-8*i))&0xff)
		}
		vals = append(vals, uint64(ip)&(1<<(8*(5-n))-1))
		host := ""
		for i, v := range vals {
			if i > 0 {
				host += "."
			}
			switch (int(base) + i) % 3 {
			case 0:
				host += strconv.FormatUint(v, 10)
			case 1:
				host += "0" + strconv.FormatUint(v, 8)
			case 2:
				host += fmt.Sprintf("0x%x", v)
			}
		}
		a, name, err := ParseHost(host)
		if err != nil || name != "" || a != want {
			t.Fatalf("ParseHost(%q) = %v, %q, %v; want %s", host, a, name, err, want)
		}
		_, errSpelled := g.Resolve(context.Background(), host)
		errPlain := g.Check(want)
		var de *DeniedError
		if (errSpelled == nil) != (errPlain == nil) || (errSpelled != nil && !errors.As(errSpelled, &de)) {
			t.Fatalf("%q: %v, but %s: %v", host, errSpelled, want, errPlain)
		}
	})
}
