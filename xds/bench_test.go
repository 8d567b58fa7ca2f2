package xds

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"wb/internal/redistest"
	"wb/internal/testwait"
	"wb/session"
	"wb/store"
)

// BenchmarkBuild1000Nodes: Build and Snapshot (every resource's ValidateAll, Consistent and
// the content hashes) for a fleet of 1,000 nodes and 3 gateways.
func BenchmarkBuild1000Nodes(b *testing.B) {
	f := Fleet{Gateways: []Gateway{
		{ID: "gw_1", HTTPAddr: "10.1.0.1:8080", AuthzAddr: "10.1.0.1:9001"},
		{ID: "gw_2", HTTPAddr: "10.1.0.2:8080", AuthzAddr: "10.1.0.2:9001"},
		{ID: "gw_3", HTTPAddr: "10.1.0.3:8080", AuthzAddr: "10.1.0.3:9001"},
	}}
	for i := range 1000 {
		f.Nodes = append(f.Nodes, Node{ID: fmt.Sprintf("node_%04d", i), Addr: fmt.Sprintf("http://10.0.%d.%d:7070", i/250, i%250+1), Draining: i%50 == 0})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Build(f, Options{}).Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
}

// churn runs the xDS server against a real redis-server with three nodes registered and one
// ADS client subscribed to every cluster and endpoint, creates sessions at rate per second
// for d (the nodes heartbeat their changing usage meanwhile), and answers the snapshots
// published and the xDS responses the client received during the churn.
func churn(tb testing.TB, rate int, d time.Duration) (published, responses float64, creates int) {
	ctx := tb.Context()
	st := store.New(redistest.Server(tb))
	infos := []store.NodeInfo{
		{ID: "node-a", Addr: "http://127.0.0.1:7001", Region: "local", Tiers: []int{1, 2}},
		{ID: "node-b", Addr: "http://127.0.0.1:7002", Region: "local", Tiers: []int{1, 2}},
		{ID: "node-c", Addr: "http://127.0.0.1:7003", Region: "local", Tiers: []int{1, 2}},
	}
	for _, n := range infos {
		if err := st.Heartbeat(ctx, n); err != nil {
			tb.Fatal(err)
		}
	}
	s, err := New(ctx, Config{Source: StoreFleet{Store: st}, PollEvery: 100 * time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go s.Run(runCtx)
	ads, err := adsConn(tb, startServer(tb, s)).StreamAggregatedResources(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	node := &corev3.Node{Id: "envoy-churn"}
	// As Envoy does: every cluster (legacy wildcard), the endpoints of each by name.
	names := map[string][]string{resourcev3.ClusterType: nil, resourcev3.EndpointType: {ClusterExtAuthz, ClusterGateway, ClusterNodes}}
	for _, n := range infos {
		names[resourcev3.EndpointType] = append(names[resourcev3.EndpointType], NodeCluster(n.ID))
	}
	for typ, rn := range names {
		if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typ, ResourceNames: rn}); err != nil {
			tb.Fatal(err)
		}
	}
	go func() { // ACK everything
		for {
			resp, err := ads.Recv()
			if err != nil {
				return
			}
			ads.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resp.GetTypeUrl(), ResourceNames: names[resp.GetTypeUrl()],
				VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
		}
	}()
	sent := func() float64 {
		return testutil.ToFloat64(s.metrics.responses.WithLabelValues(shortType(resourcev3.ClusterType))) +
			testutil.ToFloat64(s.metrics.responses.WithLabelValues(shortType(resourcev3.EndpointType)))
	}
	testwait.For(tb, 30*time.Second, "the first CDS and EDS responses", func() bool { return sent() == 2 })
	published0, sent0 := testutil.ToFloat64(s.metrics.published), sent()

	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		now := time.Now()
		sess := &session.Session{
			ID: session.NewID("sess_", now), Object: session.ObjectName, Tier: 2, State: session.Pending,
			ProjectID: fmt.Sprintf("proj_%d", i%16), Template: "tpl_base@sha256:abc", Region: "local",
			Resources:    session.Resources{VCPU: 1, MemoryMiB: 2048, DiskGiB: 10, SizeClass: "s"},
			IdleTimeoutS: 300, MaxLifetimeS: 3600, CreatedAt: *session.At(now),
		}
		if _, err := st.Create(ctx, sess, 1<<30); err != nil {
			tb.Fatal(err)
		}
		creates++
		if i%10 == 0 { // the nodes' usage moves with the sessions
			n := infos[i%3]
			n.UsedVCPU, n.UsedMemoryMiB = i, i*2048
			if err := st.Heartbeat(ctx, n); err != nil {
				tb.Fatal(err)
			}
		}
	}
	// One more poll after the last write, so that a change it made would be counted.
	if err := s.Refresh(ctx); err != nil {
		tb.Fatal(err)
	}
	return testutil.ToFloat64(s.metrics.published) - published0, sent() - sent0, creates
}

// TestSessionChurnCausesNoPushes: 100 session creates per second for 2 s publish no snapshot
// and send no xDS response (routes name the node through a header, never a session).
func TestSessionChurnCausesNoPushes(t *testing.T) {
	published, responses, creates := churn(t, 100, 2*time.Second)
	if creates < 100 {
		t.Fatalf("only %d creates", creates)
	}
	if published != 0 || responses != 0 {
		t.Errorf("%d creates: %v snapshots published, %v xDS responses; want 0", creates, published, responses)
	}
}

// BenchmarkSessionChurnPushes reports xDS pushes per minute while sessions are created at
// 100/s against a real redis-server (target: 0).
func BenchmarkSessionChurnPushes(b *testing.B) {
	const d = 3 * time.Second
	var published, responses float64
	for b.Loop() {
		p, r, _ := churn(b, 100, d)
		published, responses = published+p, responses+r
	}
	minutes := float64(b.N) * d.Minutes()
	b.ReportMetric(published/minutes, "snapshots/min")
	b.ReportMetric(responses/minutes, "pushes/min")
}
