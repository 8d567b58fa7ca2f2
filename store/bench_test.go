package store

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
)

// latencies collects per-op durations from parallel workers and reports p50 and p99.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B) {
	if len(l.d) == 0 {
		return
	}
	slices.Sort(l.d)
	q := func(p float64) float64 { return float64(l.d[int(float64(len(l.d)-1)*p)].Microseconds()) }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkCreate: Create (slot + pending + indexes + outbox in one script) against a local
// redis-server, from 16 concurrent clients.
func BenchmarkCreate(b *testing.B) {
	s := New(redistest.Server(b))
	ctx := context.Background()
	var lat latencies
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for i := 0; pb.Next(); i++ {
			sess := newPending(fmt.Sprintf("proj_b%d", i%64), "eu_1")
			t0 := time.Now()
			if _, err := s.Create(ctx, sess, 1<<30); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		lat.add(mine)
	})
	lat.report(b)
}

// BenchmarkTransition: one compare-and-set transition per op (running ⇄ paused), each on its
// own session, against a local redis-server.
func BenchmarkTransition(b *testing.B) {
	s := New(redistest.Server(b))
	ctx := context.Background()
	var lat latencies
	// One running session per worker, made before the clock starts.
	const workers = 64
	ids := make(chan string, workers)
	for w := 0; w < workers; w++ {
		sess := newPending("proj_t", "")
		if _, err := s.Create(ctx, sess, 1<<30); err != nil {
			b.Fatal(err)
		}
		for _, c := range []Change{
			{From: session.Pending, To: session.Provisioning, Driver: session.Placer},
			{From: session.Provisioning, To: session.Running, Driver: session.Node},
		} {
			c.Project, c.ID = "proj_t", sess.ID
			if _, err := s.Transition(ctx, c); err != nil {
				b.Fatal(err)
			}
		}
		ids <- sess.ID
	}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		sess := &session.Session{ID: <-ids}
		var mine []time.Duration
		from, to := session.Running, session.Paused
		for pb.Next() {
			t0 := time.Now()
			if _, err := s.Transition(ctx, Change{Project: "proj_t", ID: sess.ID, From: from, To: to, Driver: session.Caller}); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
			from, to = to, from
		}
		lat.add(mine)
	})
	lat.report(b)
}

// BenchmarkRedisBenchmarkSet is the baseline that Create and Transition are read against,
// measured in the same run: redis-benchmark's SET from 16 clients (as many as theirs), 100,000
// requests a run, against a redis-server of its own on loopback. ns/op is one whole run.
func BenchmarkRedisBenchmarkSet(b *testing.B) {
	addr := redistest.ServerAddr(b)
	var sum redistest.SetBenchmark
	for b.Loop() {
		r, err := redistest.RunSetBenchmark(b.Context(), addr, 16, 100000)
		if err != nil {
			b.Fatal(err)
		}
		sum.RPS, sum.P50ms, sum.P99ms = sum.RPS+r.RPS, sum.P50ms+r.P50ms, sum.P99ms+r.P99ms
	}
	n := float64(b.N)
	b.ReportMetric(sum.RPS/n, "requests/s")
	b.ReportMetric(sum.P50ms/n*1000, "p50-µs")
	b.ReportMetric(sum.P99ms/n*1000, "p99-µs")
}
