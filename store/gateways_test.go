package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestGateways: a gateway's heartbeat registers its addresses; one silent for
// GatewayForgetAfter is forgotten, and one that shuts down removes itself.
func TestGateways(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := New(rdb, WithClock(func() time.Time { return now }))

	if err := s.GatewayHeartbeat(ctx, GatewayInfo{Addrs: []string{"10.0.0.1"}}); err == nil {
		t.Fatal("a gateway without an id was registered")
	}
	for _, g := range []GatewayInfo{
		{ID: "gw_a", Addrs: []string{"http://10.0.0.1:8080", "10.0.0.2"}},
		{ID: "gw_b", Addrs: []string{"10.0.1.1"}},
	} {
		if err := s.GatewayHeartbeat(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	ids := func() []string {
		gs, err := s.Gateways(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, g := range gs {
			out = append(out, g.ID+"="+g.Addrs[0])
		}
		slices.Sort(out)
		return out
	}
	if got := ids(); !slices.Equal(got, []string{"gw_a=http://10.0.0.1:8080", "gw_b=10.0.1.1"}) {
		t.Fatalf("registered: %v", got)
	}

	now = now.Add(GatewayForgetAfter - time.Minute)
	if err := s.GatewayHeartbeat(ctx, GatewayInfo{ID: "gw_b", Addrs: []string{"10.0.1.1"}}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Minute)
	if got := ids(); !slices.Equal(got, []string{"gw_b=10.0.1.1"}) {
		t.Fatalf("after gw_a fell silent: %v", got)
	}
	if n, _ := rdb.HLen(ctx, GatewaysKey).Result(); n != 1 {
		t.Fatalf("the stale registration was not deleted: %d left", n)
	}
	if err := s.RemoveGateway(ctx, "gw_b"); err != nil {
		t.Fatal(err)
	}
	if got := ids(); len(got) != 0 {
		t.Fatalf("after gw_b left: %v", got)
	}
}

// TestNodeDraining: a drain survives the node's own heartbeats (which rewrite its
// registration) and ends when the operator ends it.
func TestNodeDraining(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	s := New(rdb)
	draining := func() bool {
		ns, err := s.Nodes(ctx)
		if err != nil || len(ns) != 1 {
			t.Fatalf("Nodes = %v, %v", ns, err)
		}
		return ns[0].Draining
	}
	if err := s.Heartbeat(ctx, NodeInfo{ID: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeDraining(ctx, "n1", true); err != nil {
		t.Fatal(err)
	}
	if err := s.Heartbeat(ctx, NodeInfo{ID: "n1"}); err != nil {
		t.Fatal(err)
	}
	if !draining() {
		t.Fatal("a heartbeat undid the drain")
	}
	if err := s.SetNodeDraining(ctx, "n1", false); err != nil {
		t.Fatal(err)
	}
	if draining() {
		t.Fatal("the drain did not end")
	}
	if err := s.SetNodeDraining(ctx, "", true); err == nil {
		t.Fatal("a drain without a node id was accepted")
	}
}
