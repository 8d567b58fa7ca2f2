package gateway

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/plugins"
	"wb/policies"
	"wb/quota"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// benchServer is the gateway alone (default-allow admission, no placer) on a loopback port
// over a local redis-server, with a project whose limits the load cannot reach.
func benchServer(b *testing.B, opts ...func(*Config)) (url, key, project string) {
	return benchServerOn(b, redistest.Server(b), opts...)
}

// benchServerOn is benchServer over rdb.
func benchServerOn(b *testing.B, rdb redis.UniversalClient, opts ...func(*Config)) (url, key, project string) {
	st := store.New(rdb)
	cfg := Config{Store: st, Limiter: quota.NewRateLimiter(rdb), Accounts: quota.NewAccounts(rdb), Webhooks: webhooks.NewRegistry(rdb),
		Catalog: session.Catalog{{Name: "tpl_base", Digest: "sha256:aaaa"}}, Regions: []string{"local"},
		Logger: nil, Metrics: NewMetrics(st)}
	for _, o := range opts {
		o(&cfg)
	}
	gw, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	b.Cleanup(func() { srv.Close(); gw.Close() })
	key, project = benchProject(b, st)
	return srv.URL, key, project
}

// benchProject makes a project whose plan lets a benchmark create as fast as it can: the
// largest concurrency a plan may have (100,000 sessions, which never end here: no node takes
// them) and a rate far above any of these machines'. It answers its API key and id.
func benchProject(b *testing.B, st *store.Store) (key, project string) {
	ctx := context.Background()
	p, key, err := st.CreateProject(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	if err := st.SetConcurrency(ctx, p.ID, 100000); err != nil {
		b.Fatal(err)
	}
	if err := st.SetRate(ctx, p.ID, 1_000_000, 1_000_000); err != nil {
		b.Fatal(err)
	}
	return key, p.ID
}

var createBody = []byte(`{"tier":2,"template":"tpl_base","end_user_id":"eu_bench","idle_timeout_s":120}`)

// createRequest is a POST /v1/sessions of createBody to the gateway at url, with key.
func createRequest(url, key string) *http.Request {
	req, _ := http.NewRequest("POST", url+"/v1/sessions", bytes.NewReader(createBody))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	return req
}

func post(c *http.Client, url, key string) (time.Duration, error) {
	req := createRequest(url, key)
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if resp.StatusCode != 201 {
		return d, &apiError{Message: resp.Status}
	}
	return d, nil
}

func reportLatencies(b *testing.B, d []time.Duration, elapsed time.Duration) {
	slices.Sort(d)
	b.ReportMetric(float64(quantile(d, 0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(quantile(d, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(len(d))/elapsed.Seconds(), "creates/s")
}

// BenchmarkCreateSession: POST /v1/sessions as fast as 8 keep-alive clients can, through the
// whole admission pipeline (auth, validate, rate limit, default-allow, slot + persist).
func BenchmarkCreateSession(b *testing.B) {
	url, key, _ := benchServer(b)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	createInParallel(b, c, url, key)
}

// createInParallel posts creates from 4×GOMAXPROCS clients for b.N in all, and reports
// their latencies.
func createInParallel(b *testing.B, c *http.Client, url, key string) {
	var mu sync.Mutex
	var all []time.Duration
	b.SetParallelism(4)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			d, err := post(c, url, key)
			if err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, d)
		}
		mu.Lock()
		all = append(all, mine...)
		mu.Unlock()
	})
	reportLatencies(b, all, time.Since(start))
}

// BenchmarkRedisPing: one PING round trip, from as many clients as BenchmarkCreateSession
// has: the baseline, measured in the same run, that a create's cost is read against (ns/op
// beside its ns/op, p50-µs and p99-µs beside its percentiles).
func BenchmarkRedisPing(b *testing.B) {
	rdb := redistest.Server(b)
	ctx := context.Background()
	var mu sync.Mutex
	var all []time.Duration
	b.SetParallelism(4)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if err := rdb.Ping(ctx).Err(); err != nil {
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
	if len(all) == 0 {
		return // b.Error said why
	}
	slices.Sort(all)
	q := func(p float64) float64 { return float64(quantile(all, p).Microseconds()) }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "pings/s")
}

// BenchmarkCreateAt2000PerSec: an open-loop load of 2,000 creates/s for 3 s (the issue's
// target rate); p99 is measured at that rate, not at saturation.
func BenchmarkCreateAt2000PerSec(b *testing.B) {
	url, key, _ := benchServer(b)
	for b.Loop() {
		at2000PerSec(b, url, key)
	}
}

// at2000PerSec sends 2,000 creates/s for 3 s (openLoop) and reports the latencies at that
// rate rather than at saturation, and how late the client sent them.
func at2000PerSec(b *testing.B, url, key string) {
	const rate, secs = 2000, 3
	start := time.Now()
	res, err := openLoop(url, key, rate, secs)
	if err != nil {
		b.Fatal(err)
	}
	reportLatencies(b, res.answered, time.Since(start))
	b.ReportMetric(float64(quantile(res.late, 0.99).Microseconds()), "late-p99-µs")
}

// BenchmarkCreateWithPlugin: the same pipeline with one tenant plugin (the allowlist example,
// built from source) in the admission chain, at the 2,000/s rate.
func BenchmarkCreateWithPlugin(b *testing.B) {
	wasm := filepath.Join(b.TempDir(), "allowlist.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasm, "../plugins/examples/allowlist")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build the plugin: %v\n%s", err, out)
	}
	mod, err := os.ReadFile(wasm)
	if err != nil {
		b.Fatal(err)
	}
	var host *plugins.Host
	rdb := redistest.Server(b)
	url, key, project := benchServerOn(b, rdb, func(c *Config) {
		host, err = plugins.NewHost(context.Background(), rdb, plugins.Options{Timeout: 100 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = host.Close(context.Background()) })
		c.Plugins = host
	})
	if _, err := host.Put(context.Background(), project, "allowlist", mod, []string{"admission"}, 0, false); err != nil {
		b.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	if _, err := post(c, url, key); err != nil { // compile and warm the pool outside the clock
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		at2000PerSec(b, url, key)
	}
}

// BenchmarkCreateWithRego: BenchmarkCreateSession's load with the Rego engine in the
// admission chain (the platform's shipped policy and the project's empty set), as `wb serve`
// runs: the decision reads the slots in use.
func BenchmarkCreateWithRego(b *testing.B) {
	rdb := redistest.Server(b)
	url, key, _ := benchServerOn(b, rdb, func(c *Config) {
		pol, err := policies.New(context.Background(), rdb, policies.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = pol.Close(context.Background()) })
		c.Policies = pol
	})
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	if _, err := post(c, url, key); err != nil { // load the scripts and the policy set outside the clock
		b.Fatal(err)
	}
	createInParallel(b, c, url, key)
}
