package netguard

import (
	"context"
	"net"
	"net/netip"
	"testing"
)

// BenchmarkCheck is the egress proxy's cost per checked address, with the platform's own
// addresses registered as a fleet of 100 hosts would register them.
func BenchmarkCheck(b *testing.B) {
	g, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	var fleet []netip.Addr
	for i := range 100 {
		fleet = append(fleet, netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}))
	}
	g.SetDenied("nodes", fleet)
	public := netip.MustParseAddr("93.184.215.14")
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Check(public); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDial compares a guarded dial of a numeric host (parse, check, dial) with a bare
// net.Dialer dial of the same loopback listener, the baseline measured in the same run.
func BenchmarkDial(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		b.Skip("no 127.0.0.2 here:", err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	ctx := context.Background()
	g, err := New(Options{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		dial func(ctx context.Context, network, address string) (net.Conn, error)
	}{
		{"bare", (&net.Dialer{}).DialContext},
		{"guarded", g.DialContext},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				conn, err := c.dial(ctx, "tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				conn.Close()
			}
		})
	}
}
