package plugins

import (
	"context"
	"slices"
	"testing"
	"time"

	"wb/session"
)

// BenchmarkDecide: one admission through one plugin on a reused instance, with the deadline on
// (WithCloseOnContextDone). p50_µs is the median of the individual calls.
//
//   - raw: a hand-written module (the host's own cost: alloc, write, decide, read, JSON result)
//   - rawgo: a Go guest without the SDK (adds the Go runtime's entry and exit)
//   - noop: a Go guest on the SDK (adds decoding the input and encoding the result)
//   - allowlist: the example plugin
func BenchmarkDecide(b *testing.B) {
	for _, c := range []struct {
		name string
		wasm []byte
	}{
		{"raw", constPlugin(`{"allow":true}`)},
		{"rawgo", guests["rawgo"]},
		{"noop", guests["noop"]},
		{"allowlist", guests["allowlist"]},
	} {
		b.Run(c.name, func(b *testing.B) {
			// The deadline is on whatever its length; a long one keeps a loaded machine from failing the run.
			h, _ := newTestHost(b, mini(b), Options{Timeout: time.Second})
			const p = "proj-bench"
			mustPut(b, h, p, c.name, c.wasm, 0, false)
			in := admission(b, session.CreateRequest{Tier: intp(1), Template: "tpl_dev_polyglot", EndUserID: "user_1",
				Metadata: map[string]string{"team": "core", "cost_center": "42"}})
			ctx := context.Background()
			for range 200 { // warm: the instance's heap, the caches
				if _, err := h.Decide(ctx, p, session.PointAdmission, in); err != nil {
					b.Fatal(err)
				}
			}
			times := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				ds, err := h.Decide(ctx, p, session.PointAdmission, in)
				times = append(times, time.Since(start))
				if err != nil || len(ds) != 1 || !ds[0].Allow {
					b.Fatalf("%+v %v", ds, err)
				}
			}
			b.StopTimer()
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Nanoseconds())/1e3, "p50_µs")
			b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds())/1e3, "p99_µs")
		})
	}
}

// BenchmarkCompile: validating (compiling and starting) the allowlist example with an empty
// compilation cache directory, and with one that already holds it (as after a restart).
func BenchmarkCompile(b *testing.B) {
	wasm := guests["allowlist"]
	ctx := context.Background()
	validate := func(b *testing.B, dir string) {
		h, err := NewHost(ctx, nil, Options{CacheDir: dir, Logger: nil})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := h.Validate(ctx, wasm); err != nil {
			b.Fatal(err)
		}
		if err := h.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			validate(b, b.TempDir())
		}
	})
	b.Run("cached", func(b *testing.B) {
		dir := b.TempDir()
		validate(b, dir)
		for b.Loop() {
			validate(b, dir)
		}
	})
}
