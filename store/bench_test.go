package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// BenchmarkRunStartFinish: the store's writes for one run from its start to its end, as the
// gateway makes them (its work lease taken, the record made, started, finished with its
// run.finished, the lease released; no renewal: a run shorter than a third of the lease
// makes none), over 64 projects from 16 concurrent clients, against a local redis-server and
// a 3-master Cluster. "lease" is the lease's part alone (taken and released): the writes of
// the runs' lease set that every run of the fleet makes. ops/s: runs a second. Read against
// BenchmarkRedisBenchmarkSet of the same run.
func BenchmarkRunStartFinish(b *testing.B) {
	for _, backend := range []struct {
		name string
		new  func(testing.TB) redis.UniversalClient
	}{
		{"redis", func(t testing.TB) redis.UniversalClient { return redistest.Server(t) }},
		{"cluster", func(t testing.TB) redis.UniversalClient { return redistest.Cluster(t) }},
	} {
		for _, whole := range []bool{true, false} {
			name := backend.name + "/lease"
			if whole {
				name = backend.name + "/run"
			}
			b.Run(name, func(b *testing.B) {
				rdb := backend.new(b)
				s := New(rdb)
				ctx := context.Background()
				var lat latencies
				var seq atomic.Int64
				cluster, _ := rdb.(*redis.ClusterClient)
				if cluster != nil {
					if err := cluster.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
						return m.ConfigResetStat(ctx).Err()
					}); err != nil {
						b.Fatal(err)
					}
				}
				b.SetParallelism(8)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					var mine []time.Duration
					for pb.Next() {
						i := seq.Add(1)
						now := time.Now()
						project := fmt.Sprintf("proj_b%d", i%64)
						ref := RunRef{Project: project, ID: session.NewID("run_", now), Attempt: session.NewID("lease_", now)}
						t0 := time.Now()
						if err := runStartFinish(ctx, s, ref, now, whole); err != nil {
							b.Error(err)
							return
						}
						mine = append(mine, time.Since(t0))
					}
					lat.add(mine)
				})
				lat.report(b)
				if cluster != nil {
					b.ReportMetric(hottestMaster(ctx, b, cluster), "hottest-master-%")
				}
			})
		}
	}
}

// hottestMaster answers the share (%) of the scripts run on a Cluster that its busiest
// master ran: with every lease in one key, one master runs every lease's script.
func hottestMaster(ctx context.Context, b *testing.B, c *redis.ClusterClient) float64 {
	var mu sync.Mutex
	var calls []int64
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		info, err := m.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		var n int64
		for line := range strings.SplitSeq(info, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
				n, _ = strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			}
		}
		mu.Lock()
		calls = append(calls, n)
		mu.Unlock()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, n := range calls {
		total += n
	}
	if total == 0 {
		return 0
	}
	return float64(slices.Max(calls)) * 100 / float64(total)
}

// runStartFinish makes one run's writes (whole) or its lease's alone.
func runStartFinish(ctx context.Context, s *Store, ref RunRef, now time.Time, whole bool) error {
	if err := s.SetRunWork(ctx, ref, now.Add(30*time.Second)); err != nil {
		return err
	}
	if whole {
		sess := "sess_1"
		run := &session.Run{ID: ref.ID, Object: "run", SessionID: &sess, State: session.RunQueued, CreatedAt: *session.At(now)}
		if created, err := s.CreateRun(ctx, ref.Project, run, ref.Attempt); err != nil || !created {
			return fmt.Errorf("create run %s: %v %w", ref.ID, created, err)
		}
		run.State, run.StartedAt = session.RunRunning, session.At(now)
		if ok, err := s.StartRun(ctx, ref.Project, run, ref.Attempt); err != nil || !ok {
			return fmt.Errorf("start run %s: %v %w", ref.ID, ok, err)
		}
		run.State, run.FinishedAt, run.Stdout = session.RunSucceeded, session.At(now), "ran\n"
		if ok, err := s.FinishRun(ctx, ref.Project, run, ref.Attempt, run, 0); err != nil || !ok {
			return fmt.Errorf("finish run %s: %v %w", ref.ID, ok, err)
		}
	}
	if ok, err := s.ReleaseRunWork(ctx, ref, ref.Attempt); err != nil || !ok {
		return fmt.Errorf("release the lease of run %s: %v %w", ref.ID, ok, err)
	}
	return nil
}

// BenchmarkAdmitCall: the admit script's keys and arguments for a create's session (Admit's
// own CPU besides its round trip).
func BenchmarkAdmitCall(b *testing.B) {
	s := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}))
	sess := newPending("proj_01JEZABCDEFGHJKMNPQRSTVWXY", "eu_bench")
	sess.PolicyID, sess.Metadata = nil, nil // as the gateway's creates, with their connect URLs
	sess.Connect = session.Connect{ExecURL: "http://127.0.0.1:8080/v1/sessions/" + sess.ID + "/exec",
		PTYURL: "ws://127.0.0.1:8080/v1/sessions/" + sess.ID + "/pty"}
	a := Admission{RatePerSec: 1_000_000, Burst: 1_000_000, CapMonth: "202612", Concurrency: 100_000}
	b.ReportAllocs()
	cpu := cpuTime(b)
	for b.Loop() {
		s.admitCall(sess, a)
	}
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the CPU the process has used (user and system, all threads, the garbage
// collector's too): beside ns/op, which on a loaded machine counts others' time as well.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
