package xds

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	grpcxds "google.golang.org/grpc/xds"

	"wb/internal/redistest"
	"wb/internal/testwait"
	"wb/store"
)

// staticSource is a FleetSource a test sets by hand.
type staticSource struct {
	mu  sync.Mutex
	f   Fleet
	err error
}

func (s *staticSource) Fleet(context.Context) (Fleet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f, s.err
}

func (s *staticSource) set(f Fleet, err error) {
	s.mu.Lock()
	s.f, s.err = f, err
	s.mu.Unlock()
}

// startServer serves s's ADS on a loopback port and answers its address.
func startServer(t testing.TB, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// TestLastGoodKept: a failed fleet read and an invalid snapshot each leave the last good
// snapshot published and are counted; a bad address only leaves its node out.
func TestLastGoodKept(t *testing.T) {
	ctx := t.Context()
	src := &staticSource{f: fleet3()}
	reg := prometheus.NewRegistry()
	s, err := New(ctx, Config{Source: src, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	good, ok := s.Versions()
	if !ok || testutil.ToFloat64(s.metrics.published) != 1 {
		t.Fatalf("first snapshot not published: %v %v", good, ok)
	}
	cached, err := s.cache.GetSnapshot(fleetKey)
	if err != nil {
		t.Fatal(err)
	}

	src.set(Fleet{}, errors.New("redis down"))
	if err := s.Refresh(ctx); err == nil {
		t.Error("failed read: no error")
	}
	if got := testutil.ToFloat64(s.metrics.failures.WithLabelValues("read")); got != 1 {
		t.Errorf("read failures = %v, want 1", got)
	}

	// An invalid snapshot (here: options no Envoy accepts) is refused.
	s.opts.ListenerPort = 70000
	src.set(fleet3(), nil)
	if err := s.Refresh(ctx); err == nil {
		t.Error("invalid snapshot: no error")
	}
	if got := testutil.ToFloat64(s.metrics.failures.WithLabelValues("invalid")); got != 1 {
		t.Errorf("invalid snapshots = %v, want 1", got)
	}
	if v, _ := s.Versions(); v != good {
		t.Errorf("versions moved to %v", v)
	}
	if now, _ := s.cache.GetSnapshot(fleetKey); now != cached {
		t.Error("the cache's snapshot was replaced")
	}
	s.opts.ListenerPort = 0

	// A node with an unparsable address is left out; the rest is published.
	f := fleet3()
	f.Nodes = append(f.Nodes, Node{ID: "node-x", Addr: "not an address"})
	src.set(f, nil)
	if err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Versions(); v != good {
		t.Errorf("a skipped node changed the resources: %v", v)
	}
	if got := testutil.ToFloat64(s.metrics.published); got != 1 {
		t.Errorf("published = %v, want 1 (nothing changed)", got)
	}
	if _, err := New(ctx, Config{Source: src, Options: Options{ListenerPort: 70000}}); err == nil {
		t.Error("New accepted port 70000")
	}
}

// grpcNode is a loopback "node": a gRPC server with the health service.
func grpcNode(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, health.NewServer())
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

// xdsClient dials xds:///wb_grpc_nodes with grpc-go's xDS resolver, bootstrapped to addr.
func xdsClient(t *testing.T, addr string) healthpb.HealthClient {
	t.Helper()
	boot, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri": addr, "channel_creds": []any{map[string]string{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]string{"id": "grpc-test-client"},
	})
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting(boot)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///"+ListenerGRPCNodes, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

// callPeer makes one call and answers the node that served it ("" on error).
func callPeer(ctx context.Context, c healthpb.HealthClient) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(true)); err != nil {
		return ""
	}
	return p.Addr.String()
}

func countOf(s *Server, typeURL string, vec *prometheus.CounterVec) float64 {
	return testutil.ToFloat64(vec.WithLabelValues(shortType(typeURL)))
}

// TestGRPCClient: grpc-go's xDS client, an independent consumer, resolves our listener,
// route, cluster and endpoints from the nodes registered in Redis and calls them; a node
// removed from Redis stops getting calls; an assignment it rejects is NACKed once and never
// sent again, and the next good snapshot reaches it.
func TestGRPCClient(t *testing.T) {
	ctx := t.Context()
	st := store.New(redistest.Server(t))
	nodeA, nodeB := grpcNode(t), grpcNode(t)
	for id, addr := range map[string]string{"node-a": nodeA, "node-b": nodeB} {
		if err := st.Heartbeat(ctx, store.NodeInfo{ID: id, Addr: "http://" + addr}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(ctx, Config{Source: StoreFleet{Store: st}, PollEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go s.Run(runCtx)
	client := xdsClient(t, startServer(t, s))

	seen := map[string]bool{}
	testwait.For(t, 30*time.Second, "calls reach both nodes", func() bool {
		seen[callPeer(ctx, client)] = true
		return seen[nodeA] && seen[nodeB]
	})

	onlyB := func(what string) {
		t.Helper()
		streak := 0
		testwait.For(t, 30*time.Second, what+": 20 calls in a row to node-b", func() bool {
			if callPeer(ctx, client) == nodeB {
				streak++
			} else {
				streak = 0
			}
			return streak >= 20
		})
	}
	// node-a drains: it leaves wb_nodes (and is DRAINING in its own cluster).
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "node-a", Addr: "http://" + nodeA, Draining: true}); err != nil {
		t.Fatal(err)
	}
	onlyB("node-a draining")
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "node-a", Addr: "http://" + nodeA}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "calls reach node-a again after draining", func() bool { return callPeer(ctx, client) == nodeA })
	// node-a leaves: every call goes to node-b.
	if err := st.RemoveNode(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	onlyB("node-a removed")

	// A rejected assignment: gRPC refuses two endpoints with one address. Stop polling so
	// that only this test publishes.
	stop()
	eds := resourcev3.EndpointType
	nacksBefore, sentBefore := countOf(s, eds, s.metrics.nacks), countOf(s, eds, s.metrics.responses)
	bad := Build(Fleet{Nodes: []Node{{ID: "node-b", Addr: nodeB}}}, Options{})
	for _, cla := range bad.Endpoints {
		if cla.GetClusterName() == ClusterNodes {
			lb := cla.Endpoints[0].LbEndpoints
			cla.Endpoints[0].LbEndpoints = append(lb, lb[0])
		}
	}
	if err := s.publish(ctx, bad, bad); err != nil { // without TLS, the gRPC clients' resources are the same
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "the client NACKs the duplicate endpoint", func() bool {
		return countOf(s, eds, s.metrics.nacks) > nacksBefore
	})
	// The client still calls node-b with its last good assignment.
	if got := callPeer(ctx, client); got != nodeB {
		t.Errorf("after the NACK a call went to %q", got)
	}
	// A good snapshot: node-a is back. It reaches the client at once.
	good := Build(Fleet{Nodes: []Node{{ID: "node-a", Addr: nodeA}, {ID: "node-b", Addr: nodeB}}}, Options{})
	if err := s.publish(ctx, good, good); err != nil {
		t.Fatal(err)
	}
	seen = map[string]bool{}
	testwait.For(t, 30*time.Second, "calls reach node-a again", func() bool {
		seen[callPeer(ctx, client)] = true
		return seen[nodeA]
	})
	// Exactly two assignments were sent (the rejected one, once, then the good one) and one
	// NACK came back: the rejected version was never re-sent.
	if n := countOf(s, eds, s.metrics.nacks) - nacksBefore; n != 1 {
		t.Errorf("NACKs = %v, want 1", n)
	}
	if n := countOf(s, eds, s.metrics.responses) - sentBefore; n != 2 {
		t.Errorf("EDS responses after the bad snapshot = %v, want 2 (bad once, then good)", n)
	}
	if got := testutil.ToFloat64(s.metrics.suppressed); got != 1 {
		t.Errorf("suppressed resends = %v, want 1", got)
	}
}

// adsConn is an ADS client of addr.
func adsConn(t testing.TB, addr string) discoveryv3.AggregatedDiscoveryServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return discoveryv3.NewAggregatedDiscoveryServiceClient(cc)
}

// TestReconnect: versions are content hashes, so a restarted server publishes the same
// versions, and a delta client that reconnects with the versions it holds gets no resource.
func TestReconnect(t *testing.T) {
	ctx := t.Context()
	serve := func() (*Server, string) {
		s, err := New(ctx, Config{Source: &staticSource{f: fleet3()}})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		return s, startServer(t, s)
	}
	s1, addr1 := serve()
	node := &corev3.Node{Id: "envoy-1"}
	st, err := adsConn(t, addr1).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	first, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]string{}
	for _, r := range first.GetResources() {
		held[r.GetName()] = r.GetVersion()
	}
	if len(held) != 6 {
		t.Fatalf("first delta response: %d clusters, want 6", len(held))
	}

	s2, addr2 := serve() // "restarted"
	v1, _ := s1.Versions()
	if v2, _ := s2.Versions(); v1 != v2 {
		t.Errorf("versions differ across restarts: %v vs %v", v1, v2)
	}
	st2, err := adsConn(t, addr2).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st2.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType, InitialResourceVersions: held}); err != nil {
		t.Fatal(err)
	}
	again, err := st2.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(again.GetResources()); n != 0 || len(again.GetRemovedResources()) != 0 {
		t.Errorf("reconnect with current versions: %d resources, removed %v; want none", n, again.GetRemovedResources())
	}
}

// TestStoreFleetForgetsSilentNodes: a node whose heartbeat is older than the timeout leaves
// the fleet (Envoy stops sending it connections), and comes back with its next heartbeat.
func TestStoreFleetForgetsSilentNodes(t *testing.T) {
	ctx := t.Context()
	clock := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	st := store.New(redistest.Server(t), store.WithClock(func() time.Time { return clock }))
	for _, id := range []string{"node-a", "node-b"} {
		if err := st.Heartbeat(ctx, store.NodeInfo{ID: id, Addr: "http://127.0.0.1:1"}); err != nil {
			t.Fatal(err)
		}
	}
	ids := func() string {
		t.Helper()
		f, err := StoreFleet{Store: st, HeartbeatTimeout: 10 * time.Second, Now: func() time.Time { return clock }}.Fleet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range f.Nodes {
			out = append(out, n.ID)
		}
		sort.Strings(out)
		return strings.Join(out, ",")
	}
	if got := ids(); got != "node-a,node-b" {
		t.Fatalf("fleet of two fresh nodes = %q", got)
	}
	clock = clock.Add(10 * time.Second)
	if got := ids(); got != "node-a,node-b" {
		t.Errorf("fleet 10 s after the heartbeats (the timeout) = %q, want both", got)
	}
	clock = clock.Add(time.Second)
	if got := ids(); got != "" {
		t.Errorf("fleet 11 s after the heartbeats = %q, want no node", got)
	}
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "node-b", Addr: "http://127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if got := ids(); got != "node-b" {
		t.Errorf("fleet after node-b heartbeated again = %q, want node-b", got)
	}
}
