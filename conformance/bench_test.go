package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/internal/proc"
)

// Benchmarks run against the same deployments as the tests (an external one only when it is on
// this machine's loopback). They report latency percentiles with b.ReportMetric; ns/op is the
// mean of the timed part. Each sub-benchmark stays well within ~30 s at -benchtime=20x.

func forEachBench(b *testing.B, f func(b *testing.B, d *deployment)) {
	if len(deployments) == 0 {
		b.Fatal("no deployment: TestMain did not run")
	}
	for _, d := range deployments {
		b.Run(d.name, func(b *testing.B) {
			if !d.local {
				b.Skipf("%s is not on this machine (%s): latency numbers would measure the network", d.name, d.url)
			}
			start := time.Now()
			f(b, d)
			if testing.Verbose() {
				b.Logf("b.N=%d took %s", b.N, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// percentile of sorted durations, in milliseconds.
func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.999999) - 1
	i = min(max(i, 0), len(s)-1)
	return float64(s[i].Microseconds()) / 1000
}

func reportPct(b *testing.B, prefix string, ds []time.Duration, ps ...float64) {
	for _, p := range ps {
		b.ReportMetric(pct(ds, p), fmt.Sprintf("%sp%d-ms", prefix, int(p*100)))
	}
}

// createAndWait creates a session and polls it every 2 ms until it runs. It answers the time
// from the POST to the first GET that says running, and the session.
func (d *deployment) createAndWait(b *testing.B, body map[string]any) (time.Duration, sessionObj) {
	b.Helper()
	start := time.Now()
	s := d.createSession(b, body)
	deadline := start.Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := d.request(ctx, "GET", "/v1/sessions/"+s.ID, nil, nil)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		var g sessionObj
		_ = json.Unmarshal(r.body, &g)
		if g.State == "running" {
			return time.Since(start), g
		}
		if terminal[g.State] || time.Now().After(deadline) {
			b.Fatalf("session %s: %s (state_reason %s), want running", s.ID, g.State, g.reason())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var coldBody = map[string]any{"tier": 2, "resources": map[string]any{"memory_mib": 1536}}

// BenchmarkCreateWarm: tier 2, default size, served by the warm pool. Between iterations the
// pool refills: the wait is a measured cold start plus a margin, raised whenever a session
// still came up cold (cold-starts counts those).
func BenchmarkCreateWarm(b *testing.B) {
	forEachBench(b, func(b *testing.B, d *deployment) {
		b.StopTimer()
		var cold time.Duration
		for range 2 { // how long a refill takes, roughly (the second, without first-use costs)
			el, s := d.createAndWait(b, coldBody)
			d.deleteSession(s.ID)
			cold = el
		}
		wait := cold*5/4 + 150*time.Millisecond
		time.Sleep(wait)
		var ds []time.Duration
		colds := 0
		for range b.N {
			b.StartTimer()
			el, s := d.createAndWait(b, map[string]any{"tier": 2})
			b.StopTimer()
			ds = append(ds, el)
			if s.ColdStart == nil || *s.ColdStart {
				colds++
				wait = min(wait*3/2, 10*time.Second)
			}
			d.deleteSession(s.ID)
			time.Sleep(wait) // the pool refills
		}
		reportPct(b, "", ds, 0.5, 0.99)
		b.ReportMetric(float64(colds), "cold-starts")
	})
}

// BenchmarkCreateCold: a size no pool holds (memory_mib 1536), so every guest boots.
func BenchmarkCreateCold(b *testing.B) {
	forEachBench(b, func(b *testing.B, d *deployment) {
		b.StopTimer()
		var ds []time.Duration
		warm := 0
		for range b.N {
			b.StartTimer()
			el, s := d.createAndWait(b, coldBody)
			b.StopTimer()
			ds = append(ds, el)
			if s.ColdStart != nil && !*s.ColdStart {
				warm++
			}
			d.deleteSession(s.ID)
		}
		reportPct(b, "", ds, 0.5, 0.99)
		if warm > 0 {
			b.Logf("%d of %d 'cold' sessions said cold_start false", warm, len(ds))
		}
	})
}

// BenchmarkExec: round trip of `true` through the gateway, and the same minus the duration_ms
// the guest reports (the platform's overhead). exec-502 counts the exec flake, retried.
func BenchmarkExec(b *testing.B) {
	forEachBench(b, func(b *testing.B, d *deployment) {
		b.StopTimer()
		s := d.newSession(b, nil)
		ctx := context.Background()
		body := map[string]any{"command": []string{"true"}}
		var total, over []time.Duration
		flakes := 0
		for range b.N {
			for {
				b.StartTimer()
				start := time.Now()
				r, err := d.request(ctx, "POST", "/v1/sessions/"+s.ID+"/exec", body, nil)
				el := time.Since(start)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if isExecFlake(r) && flakes < 100 {
					flakes++
					continue
				}
				if r.status != 200 {
					b.Fatalf("exec true: %s", r)
				}
				var res execResult
				_ = json.Unmarshal(r.body, &res)
				total = append(total, el)
				over = append(over, el-time.Duration(res.DurationMs)*time.Millisecond)
				break
			}
		}
		reportPct(b, "", total, 0.5, 0.99)
		reportPct(b, "overhead-", over, 0.5, 0.99)
		b.ReportMetric(float64(flakes), "exec-502")
	})
}

// BenchmarkPauseResume: latency of :pause and of :resume.
func BenchmarkPauseResume(b *testing.B) {
	forEachBench(b, func(b *testing.B, d *deployment) {
		b.StopTimer()
		s := d.newSession(b, nil)
		var pause, resume []time.Duration
		for range b.N {
			for _, a := range []struct {
				action string
				out    *[]time.Duration
			}{{"pause", &pause}, {"resume", &resume}} {
				b.StartTimer()
				start := time.Now()
				r := d.call(b, "POST", "/v1/sessions/"+s.ID+":"+a.action, nil)
				el := time.Since(start)
				b.StopTimer()
				expect(b, r, 200, ":"+a.action)
				*a.out = append(*a.out, el)
			}
		}
		reportPct(b, "pause-", pause, 0.5)
		reportPct(b, "resume-", resume, 0.5)
	})
}

// BenchmarkSnapshotRestore: :snapshot (with memory where the runtime keeps it: runsc),
// the snapshot's start to the next exec in its session answered (back: a memory snapshot is
// answered before its guest is restored), and restore_from → running. Memory snapshots are
// 3 s apart.
func BenchmarkSnapshotRestore(b *testing.B) {
	forEachBench(b, func(b *testing.B, d *deployment) {
		b.StopTimer()
		memory := d.runtime != "runc"
		s := d.newSession(b, nil)
		var snaps, backs, restores []time.Duration
		withMem := 0
		for range b.N {
			b.StartTimer()
			start := time.Now()
			r := d.call(b, "POST", "/v1/sessions/"+s.ID+":snapshot", map[string]any{"include_memory": memory})
			el := time.Since(start)
			b.StopTimer()
			expect(b, r, 201, ":snapshot")
			var snap snapshotObj
			r.decode(b, &snap)
			if snap.State != "ready" {
				b.Fatalf("snapshot answered in %s; this benchmark expects it ready", snap.State)
			}
			if snap.IncludeMemory {
				withMem++
			}
			snaps = append(snaps, el)
			expect(b, d.call(b, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"command": "true"}), 200, "exec after the snapshot")
			backs = append(backs, time.Since(start))
			b.StartTimer()
			el, ns := d.createAndWait(b, map[string]any{"tier": 2, "restore_from": snap.ID})
			b.StopTimer()
			restores = append(restores, el)
			d.deleteSession(ns.ID)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, _ = d.request(ctx, "DELETE", "/v1/snapshots/"+snap.ID, nil, nil)
			cancel()
			// The source keeps running for the next iteration.
			if g := d.getSession(b, s.ID); g.State != "running" {
				s = d.newSession(b, nil)
			}
			if memory {
				// Paced, as snapshots between an agent's turns are: the next begins once this
				// one's deletes (the guest its checkpoint stopped, the restored session's) have
				// run, each 1.4–1.6 s of CPU for runsc on these 2-core hosts.
				time.Sleep(3 * time.Second)
			}
		}
		reportPct(b, "snapshot-", snaps, 0.5, 0.99)
		reportPct(b, "back-", backs, 0.5, 0.99)
		reportPct(b, "restore-", restores, 0.5, 0.99)
		b.ReportMetric(float64(withMem), "with-memory")
	})
}

// BenchmarkRunsPython: tier-1 ephemeral python3 runs from 4 concurrent clients, and beside
// them a bare `/usr/bin/python3 -c 'print(6*7)'` on this host (bare-p50-ms, bare-p99-ms), the
// baseline of the same run.
func BenchmarkRunsPython(b *testing.B) { benchRuns(b, 4, 0) }

// BenchmarkRunsPython1: the same from one client, back to back.
func BenchmarkRunsPython1(b *testing.B) { benchRuns(b, 1, 0) }

// BenchmarkRunsPythonPaced: one client, one run every runPace: a run's latency while the warm
// pool keeps up. Back to back, each run waits for the refill its predecessor started (every
// run destroys its guest), so RunsPython1 measures the refill rate more than a run.
func BenchmarkRunsPythonPaced(b *testing.B) { benchRuns(b, 1, runPace) }

// runPace is BenchmarkRunsPythonPaced's interval: 2 runs a second, under half of what 4
// clients sustain on runsc (the slower runtime) on a 2-core host.
const runPace = 500 * time.Millisecond

// benchRuns runs b.N tier-1 python runs from clients clients, back to back, or, with pace,
// the i-th run due at pace × i from the start.
func benchRuns(b *testing.B, clients int, pace time.Duration) {
	forEachBench(b, func(b *testing.B, d *deployment) {
		b.StopTimer()
		bare := barePython(b, 20)
		b.StartTimer()
		body := map[string]any{"tier": 1, "runtime": "python3", "code": "print(6*7)"}
		var next, failed atomic.Int64
		var mu sync.Mutex
		var lat []time.Duration
		var firstErr string
		cpu0 := d.cpuNow(b)
		b.ResetTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
					if pace > 0 {
						time.Sleep(time.Until(start.Add(time.Duration(i-1) * pace)))
					}
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					t0 := time.Now()
					r, err := d.request(ctx, "POST", "/v1/runs", body, nil)
					el := time.Since(t0)
					cancel()
					var run runObj
					if err == nil {
						_ = json.Unmarshal(r.body, &run)
					}
					mu.Lock()
					lat = append(lat, el)
					if err != nil || run.State != "succeeded" || run.Stdout != "42\n" {
						failed.Add(1)
						if firstErr == "" {
							if err != nil {
								firstErr = err.Error()
							} else {
								firstErr = r.String()
							}
						}
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		b.StopTimer()
		d.reportCPU(b, cpu0, b.N)
		b.ReportMetric(float64(b.N)/el.Seconds(), "runs/s")
		reportPct(b, "", lat, 0.5, 0.99)
		reportPct(b, "bare-", bare, 0.5, 0.99)
		b.ReportMetric(float64(failed.Load()), "failed")
		if f := failed.Load(); f > 0 {
			b.Logf("%d of %d runs failed; first: %s", f, b.N, strings.TrimSpace(firstErr))
		}
	})
}

// runCPU is the host's CPU time, and its server's when this test started it, at one moment.
type runCPU struct {
	busy, wb, wbChildren time.Duration
	server               bool
}

// cpuNow reads d's host's CPU time (proc.HostBusy), and its server's (proc.CPU) when this
// test started it.
func (d *deployment) cpuNow(b *testing.B) runCPU {
	b.Helper()
	busy, err := proc.HostBusy()
	if err != nil {
		b.Fatal(err)
	}
	c := runCPU{busy: busy}
	if d.cmd != nil && d.cmd.Process != nil {
		if self, children, err := proc.CPU(d.cmd.Process.Pid); err == nil {
			c.wb, c.wbChildren, c.server = self, children, true
		}
	}
	return c
}

// reportCPU reports the CPU time that n operations took since c0, per operation, in ms: the
// host's (host-cpu-ms: guests, server, its Redis, the clients, all together; the bare
// runtime's runs report theirs alike), and, when this test started the server, the server's
// own (wb-cpu-ms) and that of the processes it ran and waited for (wb-children-cpu-ms: the
// runtime's commands, which start and end guests; not the guests, which they leave running).
func (d *deployment) reportCPU(b *testing.B, c0 runCPU, n int) {
	b.Helper()
	c := d.cpuNow(b)
	per := func(t time.Duration) float64 { return float64(t.Microseconds()) / 1000 / float64(n) }
	b.ReportMetric(per(c.busy-c0.busy), "host-cpu-ms")
	if c0.server && c.server {
		b.ReportMetric(per(c.wb-c0.wb), "wb-cpu-ms")
		b.ReportMetric(per(c.wbChildren-c0.wbChildren), "wb-children-cpu-ms")
	}
}

// guestPython is the interpreter a tier-1 python3 run starts in its guest (the host's own,
// through the guest's read-only toolchain bind; hypervisor/templates).
const guestPython = "/usr/bin/python3"

// barePython times n runs of python3 -c 'print(6*7)' on this host, of the interpreter the
// guests run: the first python3 on PATH may be another (a pyenv shim, a shell script that
// took 0.1 s per start where /usr/bin/python3 took 12 ms), and made the baseline 8× slow.
func barePython(b *testing.B, n int) []time.Duration {
	b.Helper()
	var ds []time.Duration
	for range n {
		t0 := time.Now()
		if out, err := exec.Command(guestPython, "-c", "print(6*7)").Output(); err != nil || string(out) != "42\n" {
			b.Fatalf("bare python3: %q %v", out, err)
		}
		ds = append(ds, time.Since(t0))
	}
	return ds
}
