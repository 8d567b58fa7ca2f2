package store

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
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
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		b.Fatalf("redis-benchmark (Debian package redis-tools) is not installed: %v", err)
	}
	host, port, err := net.SplitHostPort(redistest.ServerAddr(b))
	if err != nil {
		b.Fatal(err)
	}
	var rps, p50, p99 float64
	for b.Loop() {
		out, err := exec.CommandContext(b.Context(), bin, "-h", host, "-p", port, "-c", "16", "-t", "set", "-n", "100000", "--csv").Output()
		if err != nil {
			b.Fatalf("redis-benchmark: %v", err)
		}
		r, q50, q99, err := parseRedisBenchmarkCSV(out)
		if err != nil {
			b.Fatal(err)
		}
		rps, p50, p99 = rps+r, p50+q50, p99+q99
	}
	n := float64(b.N)
	b.ReportMetric(rps/n, "requests/s")
	b.ReportMetric(p50/n*1000, "p50-µs")
	b.ReportMetric(p99/n*1000, "p99-µs")
}

// parseRedisBenchmarkCSV reads redis-benchmark --csv's SET line: requests per second, and
// its p50 and p99 in milliseconds.
func parseRedisBenchmarkCSV(out []byte) (rps, p50, p99 float64, err error) {
	recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("redis-benchmark --csv: %w", err)
	}
	if len(recs) < 2 {
		return 0, 0, 0, fmt.Errorf("redis-benchmark --csv: %d lines, want a header and SET: %q", len(recs), out)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	get := func(name string) (float64, error) {
		i, ok := col[name]
		if !ok || i >= len(recs[1]) {
			return 0, fmt.Errorf("redis-benchmark --csv: no column %q in %q", name, recs[0])
		}
		v, err := strconv.ParseFloat(recs[1][i], 64)
		if err != nil {
			return 0, fmt.Errorf("redis-benchmark --csv: column %q: %w", name, err)
		}
		return v, nil
	}
	if rps, err = get("rps"); err != nil {
		return 0, 0, 0, err
	}
	if p50, err = get("p50_latency_ms"); err != nil {
		return 0, 0, 0, err
	}
	if p99, err = get("p99_latency_ms"); err != nil {
		return 0, 0, 0, err
	}
	return rps, p50, p99, nil
}

// TestParseRedisBenchmarkCSV: the baseline's numbers from redis-benchmark 7's --csv output
// (captured here), and an error naming what is missing otherwise.
func TestParseRedisBenchmarkCSV(t *testing.T) {
	t.Parallel()
	out := "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n" +
		"\"SET\",\"20533.88\",\"0.517\",\"0.064\",\"0.271\",\"1.207\",\"4.479\",\"84.671\"\n"
	rps, p50, p99, err := parseRedisBenchmarkCSV([]byte(out))
	if err != nil || rps != 20533.88 || p50 != 0.271 || p99 != 4.479 {
		t.Fatalf("%v %v %v %v", rps, p50, p99, err)
	}
	for _, c := range []struct{ out, want string }{
		{"", "0 lines"},
		{"\"test\",\"rps\"\n\"SET\",\"1\"\n", `no column "p50_latency_ms"`},
		{"\"test\",\"rps\",\"p50_latency_ms\",\"p99_latency_ms\"\n\"SET\",\"x\",\"1\",\"1\"\n", `column "rps"`},
		{"\"a\n", "redis-benchmark --csv"},
	} {
		if _, _, _, err := parseRedisBenchmarkCSV([]byte(c.out)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %s", c.out, err, c.want)
		}
	}
}
