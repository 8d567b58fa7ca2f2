package gateway

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

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
	ab := newAuthzBench(b)
	ctx := context.Background()
	conn, err := grpc.NewClient(ab.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := authv3.NewAuthorizationClient(conn)
	reqs := ab.reqs
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
	if err := ab.rdb.Set(ctx, "bench:get", "x", 0).Err(); err != nil {
		b.Fatal(err)
	}
	gets, getsElapsed := parallelLatencies(b, func() error { return ab.rdb.Get(ctx, "bench:get").Err() })
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

// BenchmarkAuthzCheckH2load: the same Check at 64 in flight, sent as Envoy sends it, from a
// C client: h2load (nghttp2's load tool, Debian package nghttp2-client) on 4 HTTP/2
// connections (an Envoy of 4 workers) of 16 streams each, from one thread. h2load is to gRPC
// what wrk is to the creates: it costs the machine little, where grpc-go's client in
// BenchmarkAuthzCheck takes a good part of the two CPUs that the server then lacks. h2load
// sends one body, so every Check is of one session, answered from the gateway's cache, as a
// busy session's stream of execs is. Its baseline, in the same run and from the same h2load:
// grpc-go's health Check, a call that does nothing. With 64 calls in flight and no pause
// between them, each waits for the others: the mean latency is 64 over the calls a second
// (Little's law), whatever the call costs.
func BenchmarkAuthzCheckH2load(b *testing.B) {
	if _, err := exec.LookPath("h2load"); err != nil {
		b.Fatalf("h2load (Debian package nghttp2-client) is not installed: %v", err)
	}
	ab := newAuthzBench(b)
	const n = 100_000
	var checks, noops h2loadResult
	for b.Loop() {
		allowed := ab.allowed.Load()
		checks = h2load(b, "http://"+ab.addr+"/envoy.service.auth.v3.Authorization/Check", ab.reqs[0], n)
		if got := ab.allowed.Load() - allowed; got != n {
			b.Fatalf("h2load sent %d Checks and %d were allowed", n, got)
		}
		answered := ab.answered.Load()
		noops = h2load(b, "http://"+ab.addr+"/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, n)
		if got := ab.answered.Load() - answered; got != n {
			b.Fatalf("h2load sent %d health Checks and %d were answered", n, got)
		}
	}
	q := func(d []time.Duration, p float64) float64 { return float64(quantile(d, p).Microseconds()) }
	b.ReportMetric(q(checks.latencies, 0.5), "p50-µs")
	b.ReportMetric(q(checks.latencies, 0.99), "p99-µs")
	b.ReportMetric(checks.perSec, "checks/s")
	b.ReportMetric(q(noops.latencies, 0.5), "grpc-noop-p50-µs")
	b.ReportMetric(q(noops.latencies, 0.99), "grpc-noop-p99-µs")
	b.ReportMetric(noops.perSec, "grpc-noops/s")
}

// h2loadResult is one h2load run's latencies, sorted, and the calls it had answered a second.
type h2loadResult struct {
	latencies []time.Duration
	perSec    float64
}

// h2load sends n unary gRPC calls of msg to url from h2load, 64 in flight (4 connections of
// 16 streams, one thread). Any call answered other than HTTP 200 fails the benchmark; a gRPC
// status travels in the trailers, which h2load does not read, so the caller checks those.
func h2load(b *testing.B, url string, msg proto.Message, n int) h2loadResult {
	body, err := proto.Marshal(msg)
	if err != nil {
		b.Fatal(err)
	}
	frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body))) // not compressed, length
	dir := b.TempDir()
	data, logFile := filepath.Join(dir, "body"), filepath.Join(dir, "log")
	if err := os.WriteFile(data, append(frame, body...), 0o600); err != nil {
		b.Fatal(err)
	}
	out, err := exec.CommandContext(b.Context(), "h2load", "-n", strconv.Itoa(n), "-c", "4", "-m", "16", "-t", "1",
		"-d", data, "-H", "content-type: application/grpc", "-H", "te: trailers", "--log-file", logFile, url).CombinedOutput()
	if err != nil {
		b.Fatalf("h2load: %v\n%s", err, out)
	}
	res, err := parseH2load(out, logFile)
	if err != nil {
		b.Fatalf("%v\n%s", err, out)
	}
	if len(res.latencies) != n {
		b.Fatalf("h2load: %d of %d calls answered 200\n%s", len(res.latencies), n, out)
	}
	return res
}

// parseH2load reads h2load's summary ("finished in 2.01s, 49750.12 req/s, …") and its log
// file: a line per request, "START_µs\tSTATUS\tDURATION_µs". Requests answered other than
// 200 are left out of the latencies.
func parseH2load(out []byte, logFile string) (h2loadResult, error) {
	var res h2loadResult
	if _, err := fmt.Sscanf(lineAfter(string(out), "finished in "), "%s %g req/s", new(string), &res.perSec); err != nil {
		return res, fmt.Errorf("h2load's summary: %w", err)
	}
	log, err := os.ReadFile(logFile)
	if err != nil {
		return res, fmt.Errorf("h2load's log: %w", err)
	}
	for line := range strings.Lines(string(log)) {
		f := strings.Fields(line)
		if len(f) != 3 {
			return res, fmt.Errorf("h2load's log: line %q: want 3 fields", line)
		}
		us, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return res, fmt.Errorf("h2load's log: line %q: %w", line, err)
		}
		if f[1] == "200" {
			res.latencies = append(res.latencies, time.Duration(us)*time.Microsecond)
		}
	}
	slices.Sort(res.latencies)
	return res, nil
}

// authzBench is an ext_authz service on loopback for the benchmarks, beside grpc-go's health
// service, with 256 running sessions of one project and a Check request for each.
type authzBench struct {
	addr string
	reqs []*authv3.CheckRequest
	rdb  redis.UniversalClient
	// answered counts the calls answered without an error, allowed the Checks among them that
	// the service allowed with a node's headers.
	answered, allowed atomic.Int64
}

func newAuthzBench(b *testing.B) *authzBench {
	rdb := redistest.Server(b)
	st := store.New(rdb)
	ctx := context.Background()
	gw, err := New(Config{Store: st, Limiter: quota.NewRateLimiter(rdb), Accounts: quota.NewAccounts(rdb), Webhooks: webhooks.NewRegistry(rdb),
		Catalog: session.Catalog{{Name: "tpl_base", Digest: "sha256:aaaa"}}, Regions: []string{"local"}, Metrics: NewMetrics(st)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(gw.Close)
	p, key, err := st.CreateProject(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	if err := st.SetConcurrency(ctx, p.ID, 100000); err != nil {
		b.Fatal(err)
	}
	ab := &authzBench{rdb: rdb}
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
		ab.reqs = append(ab.reqs, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: "/v1/sessions/" + id + "/exec",
				Headers: map[string]string{"authorization": "Bearer " + key}}}}})
	}
	a, err := gw.Authz(ctx)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err == nil {
			ab.answered.Add(1)
		}
		if r, ok := resp.(*authv3.CheckResponse); ok && len(r.GetOkResponse().GetHeaders()) > 0 {
			ab.allowed.Add(1)
		}
		return resp, err
	}))
	a.Register(g)
	// The baseline: grpc-go's own health service, a call that does nothing, on the same
	// server, so that the figure shows what Check adds to gRPC itself.
	healthpb.RegisterHealthServer(g, health.NewServer())
	go func() { _ = g.Serve(ln) }()
	b.Cleanup(g.Stop)
	ab.addr = ln.Addr().String()
	return ab
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
