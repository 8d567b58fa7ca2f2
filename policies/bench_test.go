package policies

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
)

// benchEngine is an engine on its own Redis, as wb runs it, without its log lines.
func benchEngine(b *testing.B) *Engine {
	ctx := context.Background()
	e, err := New(ctx, redistest.Server(b), Options{Logger: slog.New(slog.DiscardHandler), Refresh: time.Hour,
		DecisionLog: DecisionLogOptions{Buffer: 1 << 16}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close(ctx) })
	return e
}

// benchAdmit times Engine.Admit call by call and reports p50 and p99 besides ns/op and
// allocs/op. The project's policy set is loaded before the timer starts; the decision log
// writes to Redis in the background as in production. Target: p99 ≤ 100 µs for the shipped
// policy alone.
func benchAdmit(b *testing.B, tenant string) {
	ctx := context.Background()
	e := benchEngine(b)
	if tenant != "" {
		if _, err := e.Put(ctx, "proj_bench", "tenant", tenant, ModeEnforce); err != nil {
			b.Fatal(err)
		}
	}
	in := benchInput()
	if _, err := e.Admit(ctx, in); err != nil { // loads the project's set
		b.Fatal(err)
	}
	timed(b, func() {
		d, err := e.Admit(ctx, in)
		if err != nil || !d.Allow {
			b.Fatalf("%+v %v", d, err)
		}
	})
}

func benchInput() session.AdmissionInput {
	tier, idle := 4, 600
	return session.AdmissionInput{
		Request: session.CreateRequest{Tier: &tier, Template: "tpl_dev_polyglot", Region: "bom1", IdleTimeoutS: &idle,
			EndUserID: "eu_customer_4821", Metadata: map[string]string{"team": "search", "plan": "pro"}},
		ProjectID: "proj_bench",
		Plan:      session.Plan{Concurrency: 20, RatePerSec: 10},
		Active:    17,
	}
}

// timed runs op b.N times, reporting allocs/op and the p50 and p99 of its latency.
func timed(b *testing.B, op func()) {
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		op()
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

// BenchmarkShippedAdmissionEval: the shipped wb.admission's prepared query alone, input
// conversion included; no Redis, no decision log.
func BenchmarkShippedAdmissionEval(b *testing.B) {
	ctx := context.Background()
	e := &Engine{}
	p := &policy{Version: Version{ID: shippedID, Mode: ModeEnforce}, compiled: compileShipped(b)}
	in := benchInput()
	timed(b, func() {
		ev := e.begin(ctx, in.ProjectID, PointAdmission, admissionValue(in))
		doc, err := ev.eval(ctx, p)
		ev.done()
		if err != nil || len(messages(doc["warn"])) != 1 {
			b.Fatalf("%v %v", doc, err)
		}
	})
}

// BenchmarkAdmitShipped: the shipped wb.admission alone.
func BenchmarkAdmitShipped(b *testing.B) { benchAdmit(b, "") }

// BenchmarkAdmitShippedAndTenant: the shipped policy plus one enforced project policy.
func BenchmarkAdmitShippedAndTenant(b *testing.B) { benchAdmit(b, tier4Policy) }

// compileShipped compiles the shipped wb.admission as the engine does.
func compileShipped(tb testing.TB) *compiled {
	tb.Helper()
	src, err := shippedFS.ReadFile("admission.rego")
	if err != nil {
		tb.Fatal(err)
	}
	c, err := compile(context.Background(), capabilities(), "admission.rego", string(src))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// BenchmarkRuntimeExec: one exec event through the whole engine (the shipped wb.runtime, the
// decision log), as the node asks before every exec and PTY.
func BenchmarkRuntimeExec(b *testing.B) {
	ctx := context.Background()
	e := benchEngine(b)
	event := func() map[string]any {
		return map[string]any{"type": "exec", "argv": []any{"/bin/sh", "-c", "pip install -r requirements.txt"},
			"session": map[string]any{"id": "sess_bench", "tier": 2}}
	}
	timed(b, func() {
		d, err := e.Runtime(ctx, "proj_bench", "", event())
		if err != nil || d.Kill || d.Deny {
			b.Fatalf("%+v %v", d, err)
		}
	})
}
