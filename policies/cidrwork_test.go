package policies

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// TestCIDRContainsAsOPA: the estimate of net.cidr_contains_matches finds the pairs that
// match as OPA's net.cidr_contains does.
func TestCIDRContainsAsOPA(t *testing.T) {
	cidrs := []string{"0.0.0.0/0", "10.0.0.0/8", "10.1.0.0/16", "10.1.2.3/32", "10.255.255.255/32", "::/0", "::/80",
		"::ffff:0:0/96", "::ffff:10.0.0.0/104", "2001:db8::/32", "2001:db8:1::/48", "2001:db8::1/128", "11.0.0.0/8"}
	others := append([]string{"10.1.2.3", "::1", "::ffff:10.1.2.3", "2001:db8::1", "11.0.0.0", "0.0.0.0", "::"}, cidrs...)
	contains := topdown.GetBuiltin("net.cidr_contains")
	for _, a := range cidrs {
		_, network, err := net.ParseCIDR(a)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range others {
			var want bool
			if err := contains(topdown.BuiltinContext{}, []*ast.Term{ast.StringTerm(a), ast.StringTerm(b)},
				func(t *ast.Term) error { want = bool(t.Value.(ast.Boolean)); return nil }); err != nil {
				t.Fatal(err)
			}
			c, ok := parseContained(ast.StringTerm(b))
			if !ok {
				t.Fatalf("%s does not parse", b)
			}
			if got := cidrContains(network, c); got != want {
				t.Errorf("net.cidr_contains(%q, %q): the estimate says %v, OPA %v", a, b, got, want)
			}
		}
	}
}

// TestContainsMatchesProbes: net.cidr_contains_matches is refused for more than maxCIDRPairs
// pairs, or when its answer's pairs of array indexes would take OPA's set too long to build;
// it is taken for as many matching pairs indexed by sets' elements, or for a thousand pairs of
// array indexes.
func TestContainsMatchesProbes(t *testing.T) {
	strs := func(n int, f string) []*ast.Term {
		ts := make([]*ast.Term, n)
		for i := range ts {
			s := f
			if strings.Contains(f, "%") {
				s = fmt.Sprintf(f, i%256, i/256)
			}
			ts[i] = ast.StringTerm(s)
		}
		return ts
	}
	// A set of [CIDR, label]: the builtin takes the CIDR, and indexes by the pair.
	labelled := func(ts []*ast.Term) *ast.Term {
		s := ast.NewSet()
		for i, t := range ts {
			s.Add(ast.ArrayTerm(t, ast.StringTerm(fmt.Sprint("label ", i))))
		}
		return ast.NewTerm(s)
	}
	never := func() bool { return false }
	for _, c := range []struct {
		name    string
		a, b    *ast.Term
		refused bool
	}{
		{"arrays of 256 and 128, all matching", ast.ArrayTerm(strs(256, "10.0.0.0/8")...), ast.ArrayTerm(strs(128, "10.1.%d.%d")...), true},
		{"arrays of 64 and 16, all matching", ast.ArrayTerm(strs(64, "10.0.0.0/8")...), ast.ArrayTerm(strs(16, "10.1.%d.%d")...), false},
		{"arrays of 256 and 128, a few matching", ast.ArrayTerm(strs(256, "11.%d.%d.0/24")...), ast.ArrayTerm(strs(128, "11.%d.%d.5")...), false},
		{"sets of 256 and 128, all matching", labelled(strs(256, "10.0.0.0/8")), labelled(strs(128, "10.1.%d.%d")), false},
		{"sets of 400 and 100, none matching", labelled(strs(400, "11.0.0.0/8")), labelled(strs(100, "10.1.%d.%d")), true},
	} {
		_, err := estimateContainsMatches([]*ast.Term{c.a, c.b}, defaultEvalMemory, never)
		if (err != nil) != c.refused {
			t.Errorf("%s: %v, want refused %v", c.name, err, c.refused)
		}
	}
}

// TestCIDRExpandParsedAsOPA: net.cidr_expand's estimate parses a CIDR as the builtin does, so
// that a prefix length written with a leading zero (which net/netip refuses and net takes)
// does not pass unestimated: "10.0.0.0/08" expanded until the deadline, 22 MiB in 250 ms.
func TestCIDRExpandParsedAsOPA(t *testing.T) {
	never := func() bool { return false }
	for cidr, refused := range map[string]bool{
		"10.0.0.0/8": true, "10.0.0.0/08": true, "10.0.0.0/008": true, "::ffff:10.0.0.0/104": true, "2001:db8::/64": true,
		"192.168.1.0/24": false, "192.168.1.0/024": false, "2001:db8::/120": false, "10.1.2.3/32": false,
	} {
		_, err := estimateCIDRExpand([]*ast.Term{ast.StringTerm(cidr)}, defaultEvalMemory, never)
		if (err != nil) != refused {
			t.Errorf("net.cidr_expand(%q): %v, want refused %v", cidr, err, refused)
		}
	}
}

// TestCIDRMergeBounded: net.cidr_merge takes 16,384 CIDRs, and is refused more (48,000, of
// which half merge below the other half, took 200 ms in one call).
func TestCIDRMergeBounded(t *testing.T) {
	never := func() bool { return false }
	for n, refused := range map[int]bool{300: false, 16384: false, 16385: true, 48000: true} {
		ts := make([]*ast.Term, n)
		for i := range ts {
			ts[i] = ast.StringTerm(fmt.Sprintf("2001:db8::%x:0/128", i))
		}
		for _, op := range []*ast.Term{ast.ArrayTerm(ts...), ast.SetTerm(ts...)} {
			est := boundedBuiltins["net.cidr_merge"].estimate
			var err error
			if est != nil {
				_, err = est([]*ast.Term{op}, defaultEvalMemory, never)
			}
			if (err != nil) != refused {
				t.Errorf("net.cidr_merge of %d CIDRs: %v, want refused %v", n, err, refused)
			}
		}
	}
}

// TestContainsMatchesLongKeys: each probe of OPA's set compares the new pair with the one in
// its slot, so pairs indexed by long keys that hash near each other cost their keys' length a
// probe: 8 object keys [256 KiB of "x", i] matched with 170 addresses made 925,000 probes the
// estimate took, and the call 15 s. Such a call is refused; the same keys 64 bytes long are
// taken.
func TestContainsMatchesLongKeys(t *testing.T) {
	never := func() bool { return false }
	for padLen, refused := range map[int]bool{256 << 10: true, 64: false} {
		obj := ast.NewObject()
		for i := range 8 {
			pad := strings.Repeat("x", padLen) // one allocation each: equal strings compare in full
			obj.Insert(ast.ArrayTerm(ast.StringTerm(pad), ast.IntNumberTerm(i)), ast.StringTerm("10.0.0.0/8"))
		}
		ips := make([]*ast.Term, 170)
		for j := range ips {
			ips[j] = ast.StringTerm(fmt.Sprintf("10.1.%d.%d", j/256, j%256))
		}
		start := time.Now()
		_, err := estimateContainsMatches([]*ast.Term{ast.NewTerm(obj), ast.ArrayTerm(ips...)}, defaultEvalMemory, never)
		if (err != nil) != refused {
			t.Errorf("keys of %d bytes: %v, want refused %v", padLen, err, refused)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("keys of %d bytes: the estimate took %v", padLen, d)
		}
	}
}

// TestContainsMatchesMeasuresLazily: the estimate measures an index only when a pair of it
// probes, and counts each of its elements as a probe, so that measuring stays within the
// bound: 32,768 set elements sharing one array of 20,000 numbers, whose pairs do not probe,
// were each walked (650 million nodes), and elements that do probe are refused before their
// walks add up.
func TestContainsMatchesMeasuresLazily(t *testing.T) {
	nums := make([]*ast.Term, 20000)
	for i := range nums {
		nums[i] = ast.IntNumberTerm(i)
	}
	shared := ast.ArrayTerm(nums...)
	for _, c := range []struct {
		name    string
		n       int
		b       *ast.Term
		refused bool
	}{
		{"pairs that do not probe", 32768, ast.ArrayTerm(ast.StringTerm("10.1.2.3")), false},
		{"pairs that probe", 128, ast.ArrayTerm(ast.StringTerm("10.1.2.3"), ast.StringTerm("10.1.2.4"), ast.StringTerm("10.1.2.5")), true},
	} {
		s := ast.NewSet()
		for i := range c.n {
			s.Add(ast.ArrayTerm(ast.StringTerm("10.0.0.0/8"), shared, ast.IntNumberTerm(i)))
		}
		// Work is counted by the deadline's checks, not timed (a loaded machine took 500 ms
		// for what takes 70): measuring walks call stop every 4,096 terms, and walking every
		// index here is 32,768 × 20,000 terms, 160,000 calls.
		checks := 0
		counted := func() bool { checks++; return false }
		_, err := estimateContainsMatches([]*ast.Term{ast.NewTerm(s), c.b}, defaultEvalMemory, counted)
		if (err != nil) != c.refused {
			t.Errorf("%s: %v, want refused %v", c.name, err, c.refused)
		}
		if max := 2*c.n + 1000; checks > max {
			t.Errorf("%s: the estimate looked at the deadline %d times, want at most %d: it measured indexes no pair probes with", c.name, checks, max)
		}
	}
}
