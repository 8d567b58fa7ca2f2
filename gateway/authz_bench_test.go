package gateway

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"wb/internal/redistest"
	"wb/quota"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// authzBenchConcurrency is how many Checks are in flight at once, as from a busy Envoy.
const authzBenchConcurrency = 64

// BenchmarkAuthzCheck: ext_authz Check at concurrency 64 over a loopback gRPC connection,
// against a local redis-server, spread over 256 running sessions of one project (each looked
// up again at least every lookupTTL). The baseline beside it is a bare Redis GET at the same
// concurrency over the same Redis client, measured in the same run: what one uncached
// lookup would cost at least; and a no-op gRPC call (the health service) at the same
// concurrency on the same connection: what gRPC alone costs here.
func BenchmarkAuthzCheck(b *testing.B) {
	rdb := redistest.Server(b)
	st := store.New(rdb)
	ctx := context.Background()
	gw, err := New(Config{Store: st, Limiter: quota.NewRateLimiter(rdb), Accounts: quota.NewAccounts(rdb), Webhooks: webhooks.NewRegistry(rdb),
		Catalog: session.Catalog{{Name: "tpl_base", Digest: "sha256:aaaa"}}, Regions: []string{"local"}, Metrics: NewMetrics(st)})
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	p, key, err := st.CreateProject(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	if err := st.SetConcurrency(ctx, p.ID, 100000); err != nil {
		b.Fatal(err)
	}
	var paths []string
	for i := range 256 {
		id := session.NewID("sess_", time.Now())
		sess := &session.Session{ID: id, Tier: 2, State: session.Pending, ProjectID: p.ID, Template: "tpl_base@sha256:aaaa",
			Region: "local", IdleTimeoutS: 300, MaxLifetimeS: 3600, CreatedAt: *session.At(time.Now())}
		if _, err := st.Create(ctx, sess, 100000); err != nil {
			b.Fatal(err)
		}
		for _, c := range []store.Change{
			{Project: p.ID, ID: id, From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: fmt.Sprintf("node_%d", i%3)},
			{Project: p.ID, ID: id, From: session.Provisioning, To: session.Running, Driver: session.Node},
		} {
			if _, err := st.Transition(ctx, c); err != nil {
				b.Fatal(err)
			}
		}
		paths = append(paths, "/v1/sessions/"+id+"/exec")
	}

	a, err := gw.Authz(ctx)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	a.Register(g)
	// The baseline: grpc-go's own health service, a call that does nothing, on the same
	// server and connection, so that the figure shows what Check adds to gRPC itself.
	healthpb.RegisterHealthServer(g, health.NewServer())
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := authv3.NewAuthorizationClient(conn)
	reqs := make([]*authv3.CheckRequest, len(paths))
	for i, path := range paths {
		reqs[i] = &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: path, Headers: map[string]string{"authorization": "Bearer " + key}}}}}
	}
	if r, err := client.Check(ctx, reqs[0]); err != nil || r.GetOkResponse() == nil { // warm the connection and the key
		b.Fatalf("warm-up Check: %v %v", r, err)
	}

	var next atomic.Int64
	checks, elapsed := parallelLatencies(b, func() error {
		r, err := client.Check(ctx, reqs[next.Add(1)%int64(len(reqs))])
		if err == nil && r.GetOkResponse() == nil {
			err = fmt.Errorf("denied: %s", r.GetDeniedResponse().GetBody())
		}
		return err
	})
	b.StopTimer()
	if err := rdb.Set(ctx, "bench:get", "x", 0).Err(); err != nil {
		b.Fatal(err)
	}
	gets, getsElapsed := parallelLatencies(b, func() error { return rdb.Get(ctx, "bench:get").Err() })
	hc := healthpb.NewHealthClient(conn)
	noops, _ := parallelLatencies(b, func() error { _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); return err })
	q := func(d []time.Duration, p float64) float64 { return float64(quantile(d, p).Microseconds()) }
	b.ReportMetric(q(checks, 0.5), "p50-µs")
	b.ReportMetric(q(checks, 0.99), "p99-µs")
	b.ReportMetric(q(gets, 0.5), "redis-get-p50-µs")
	b.ReportMetric(q(gets, 0.99), "redis-get-p99-µs")
	b.ReportMetric(q(noops, 0.5), "grpc-noop-p50-µs")
	b.ReportMetric(q(noops, 0.99), "grpc-noop-p99-µs")
	b.ReportMetric(float64(len(checks))/elapsed.Seconds(), "checks/s")
	b.ReportMetric(float64(len(gets))/getsElapsed.Seconds(), "redis-gets/s")
}

// parallelLatencies runs op b.N times from authzBenchConcurrency goroutines and answers the
// sorted latencies and the time they took in all.
func parallelLatencies(b *testing.B, op func() error) ([]time.Duration, time.Duration) {
	var mu sync.Mutex
	var all []time.Duration
	b.SetParallelism(max(1, authzBenchConcurrency/runtime.GOMAXPROCS(0)))
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if err := op(); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		mu.Lock()
		all = append(all, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	slices.Sort(all)
	if len(all) == 0 {
		b.Fatal("no latencies")
	}
	return all, elapsed
}
