package edgeauth

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkSignVerify: one grant signed and verified, as ext_authz and the connect URLs do.
func BenchmarkSignVerify(b *testing.B) {
	s, err := NewSigner(secret, PurposeEdge)
	if err != nil {
		b.Fatal(err)
	}
	g := Grant{SessionID: "sess_0VcshxiO0jXQa7BIGU", ProjectID: "proj_0VcshxiO0jXQa7BIGU", NodeID: "node_local-abc", Expires: 4102444800}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Verify(s.Sign(g), time.Unix(1700000000, 0)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestConcurrentSignVerify: goroutines sharing one Signer (and its reused MACs) each verify
// their own grants, and a grant signed for one purpose fails under the other.
func TestConcurrentSignVerify(t *testing.T) {
	edge, connect := signer(t, PurposeEdge), signer(t, PurposeConnect)
	now := time.Unix(1700000000, 0)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 500 {
				g := Grant{SessionID: fmt.Sprintf("sess_%d_%d", w, i), ProjectID: "proj_x", Expires: now.Unix() + 60}
				v := edge.Sign(g)
				if got, err := edge.Verify(v, now); err != nil || got != g {
					t.Errorf("worker %d, grant %d: %+v, %v; want %+v", w, i, got, err, g)
					return
				}
				if _, err := connect.Verify(v, now); err == nil {
					t.Errorf("worker %d, grant %d: an edge grant verified as a connect grant", w, i)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkSign: a connect token, as each create's answer signs one.
func BenchmarkSign(b *testing.B) {
	s, err := NewSigner(secret, PurposeConnect)
	if err != nil {
		b.Fatal(err)
	}
	g := Grant{SessionID: "sess_0VcshxiO0jXQa7BIGU", ProjectID: "proj_0VcshxiO0jXQa7BIGU", Expires: 4102444800}
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Sign(g)
	}
}
