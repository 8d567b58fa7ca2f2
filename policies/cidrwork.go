package policies

import (
	"bytes"
	"fmt"
	"net"

	"github.com/open-policy-agent/opa/v1/ast"
)

// net.cidr_contains_matches answers a set of pairs [i, j] of the operands' indexes, built in
// one call. OPA's set finds a term's slot by probing upwards from its hash, and an array's
// hash is the sum of its elements', a number's its value: the pairs of two arrays' indexes
// hash to i + j, so a set of m of them fills one run of slots, and each new pair probes past
// the ones before it (m²/2 probes: 4,096 pairs took a third of a second, 32,768 took 29 s,
// in a call that does not look at the deadline). So the estimate finds the pairs that will
// match, as the builtin does, and counts the probes their set will make.

// maxCIDRPairs bounds the pairs net.cidr_contains_matches compares: it parses both CIDRs of
// each pair again, about a microsecond a pair, more for the pairs that match (400 CIDRs and
// 400 that all match took half a second).
const maxCIDRPairs = 1 << 15

// maxSetProbes bounds the probes building net.cidr_contains_matches's answer may make (a
// few tens of milliseconds).
const maxSetProbes = 1 << 20

// probeBytes is how many bytes of the pairs a probe compares count as one more probe: each
// probe compares the new pair with the one in the slot, element by element, so pairs indexed
// by long keys that collide cost their keys' length a probe (8 keys [256 KiB of "x", i] and 170
// addresses, 925,000 probes, took 15 s). Each element of the keys counts a quarter as many.
const probeBytes = 256

// cidrMatchOperand is one element of a net.cidr_contains_matches operand: the term holding
// its CIDR or address, and the index the answer names it by.
type cidrMatchOperand struct {
	cidr, index *ast.Term
}

// cidrMatchOperands answers an operand's elements, as the builtin walks them; elements the
// builtin would refuse are left out (it fails on the first it reaches).
func cidrMatchOperands(t *ast.Term) []cidrMatchOperand {
	cidrOf := func(x *ast.Term) *ast.Term {
		switch v := x.Value.(type) {
		case ast.String:
			return x
		case *ast.Array:
			if v.Len() > 0 {
				return v.Elem(0)
			}
		}
		return nil
	}
	var out []cidrMatchOperand
	add := func(x, index *ast.Term) {
		if c := cidrOf(x); c != nil {
			out = append(out, cidrMatchOperand{c, index})
		}
	}
	switch v := t.Value.(type) {
	case ast.String:
		out = append(out, cidrMatchOperand{t, t})
	case *ast.Array:
		for i := range v.Len() {
			add(v.Elem(i), ast.InternedTerm(i))
		}
	case ast.Set:
		v.Foreach(func(x *ast.Term) { add(x, x) })
	case ast.Object:
		v.Foreach(func(k, x *ast.Term) { add(x, k) })
	}
	return out
}

// containedCIDR is operand 2 of net.cidr_contains parsed as the builtin parses it: an
// address, or a network and its last address.
type containedCIDR struct {
	ip, last net.IP
	network  *net.IPNet
}

func parseContained(t *ast.Term) (containedCIDR, bool) {
	s, ok := t.Value.(ast.String)
	if !ok {
		return containedCIDR{}, false
	}
	if ip := net.ParseIP(string(s)); ip != nil {
		return containedCIDR{ip: ip}, true
	}
	_, n, err := net.ParseCIDR(string(s))
	if err != nil {
		return containedCIDR{}, false
	}
	last := bytes.Clone(n.IP)
	for i := range last {
		last[i] |= ^n.Mask[i]
	}
	return containedCIDR{network: n, last: last}, true
}

// cidrContains is net.cidr_contains(a, b) as OPA answers it.
func cidrContains(a *net.IPNet, b containedCIDR) bool {
	if b.network == nil {
		return a.Contains(b.ip)
	}
	plainV6 := func(n *net.IPNet) bool {
		return len(n.IP) == net.IPv6len && len(n.Mask) == net.IPv6len && n.IP.To4() == nil
	}
	if plainV6(a) && plainV6(b.network) {
		aOnes, _ := a.Mask.Size()
		bOnes, _ := b.network.Mask.Size()
		return aOnes <= bOnes && a.IP.Equal(b.network.IP.Mask(a.Mask))
	}
	return a.Contains(b.network.IP) && a.Contains(b.last)
}

// estimateContainsMatches is estimateProduct, and refuses a call of more than maxCIDRPairs
// pairs, or whose answer would take more than maxSetProbes probes to build.
func estimateContainsMatches(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
	n, err := estimateProduct(ops, limit, stop)
	if err != nil || n > limit {
		return n, err // refused for its size: nothing more to count
	}
	xs, ys := cidrMatchOperands(ops[0]), cidrMatchOperands(ops[1])
	if pairs := int64(len(xs)) * int64(len(ys)); pairs > maxCIDRPairs {
		return 0, fmt.Errorf("comparing %d CIDRs with %d is %d pairs, too much work for one call (at most %d): "+
			"compare fewer at once", len(xs), len(ys), pairs, maxCIDRPairs)
	}
	var nets []*net.IPNet
	var netIndexes []*ast.Term
	for _, x := range xs {
		if s, ok := x.cidr.Value.(ast.String); ok {
			if _, network, err := net.ParseCIDR(string(s)); err == nil {
				nets, netIndexes = append(nets, network), append(netIndexes, x.index)
			}
		}
	}
	var contained []containedCIDR
	var containedIndexes []*ast.Term
	for _, y := range ys {
		if c, ok := parseContained(y.cidr); ok {
			contained, containedIndexes = append(contained, c), append(containedIndexes, y.index)
		}
	}
	// A probe compares the new pair with the one in its slot, element by element: it costs
	// one, and one more for each four elements of the new pair's indexes and each probeBytes
	// of their text. An index is measured when a pair of it first probes, at most up to what the
	// bound has left, so that measuring stays within the bound.
	netCosts, containedCosts := make([]int64, len(nets)), make([]int64, len(contained))
	var probes int64
	costOf := func(costs []int64, indexes []*ast.Term, k int) int64 {
		if costs[k] == 0 {
			costs[k] = 1 + textSize(indexes[k].Value, (maxSetProbes-probes+1)*probeBytes, probeBytes/4, stop)/probeBytes
		}
		return costs[k] - 1
	}
	slots := map[int]struct{}{}
	for i, a := range nets {
		if stop() {
			return 0, nil // the caller reports it
		}
		for j, b := range contained {
			if !cidrContains(a, b) {
				continue
			}
			h := ast.ArrayTerm(netIndexes[i], containedIndexes[j]).Hash()
			for {
				if _, taken := slots[h]; !taken {
					break
				}
				h++
				if probes += 1 + costOf(netCosts, netIndexes, i) + costOf(containedCosts, containedIndexes, j); probes > maxSetProbes {
					if stop() {
						return 0, nil // the caller reports it
					}
					return 0, fmt.Errorf("its %d matching pairs and more would take OPA's set more than %d steps to "+
						"build (pairs of array indexes [i, j] all hash near i + j, and each step compares the pairs' indexes): "+
						"match fewer pairs, or pass sets or objects of CIDRs, whose elements and keys index the answer, "+
						"with short elements and keys", len(slots), maxSetProbes)
				}
			}
			slots[h] = struct{}{}
		}
	}
	return n, nil
}

// maxCIDRMerge bounds the CIDRs net.cidr_merge takes: it parses and sorts them, then merges
// each into the one before by deleting it from the slice, moving all the unmerged ones after
// it (48,000 CIDRs, half merging below the other half, took 200 ms in one call; 16,384 take
// about 50 ms).
const maxCIDRMerge = 1 << 14

// estimateCIDRMerge refuses more than maxCIDRMerge CIDRs; the answer is charged after the call.
func estimateCIDRMerge(ops []*ast.Term, _ int64, _ func() bool) (int64, error) {
	if n := length(ops[0].Value); n > maxCIDRMerge {
		return 0, fmt.Errorf("%d CIDRs are too many to merge in one call (at most %d): merge them in parts, then the parts' answers", n, maxCIDRMerge)
	}
	return 0, nil
}
