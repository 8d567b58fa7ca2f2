package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/client"
)

// TestScheduleByTheClock: flow i is due at start + i/rate exactly, none begins before its
// time, and the window holds floor(rate · duration) flows.
func TestScheduleByTheClock(t *testing.T) {
	var mu sync.Mutex
	scheduled := map[int]time.Time{}
	flow := func(ctx context.Context, tr *Trace) error {
		now := time.Now()
		if now.Before(tr.scheduled) {
			return fmt.Errorf("flow %d began %s before its time", tr.Index, tr.scheduled.Sub(now))
		}
		mu.Lock()
		scheduled[tr.Index] = tr.scheduled
		mu.Unlock()
		return tr.Step("op", func() error { return nil })
	}
	cfg := Config{Rate: 100, Duration: 300 * time.Millisecond, Concurrency: 50, Drain: time.Minute,
		Mix: []Weighted{{"f", 1}}, Flows: map[string]Flow{"f": flow}}
	rec := NewRecorder()
	sum, err := Run(context.Background(), cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Scheduled != 30 || sum.Completed != 30 || sum.Failed != 0 {
		t.Fatalf("summary %+v, want 30 scheduled and completed", sum)
	}
	for i := range 30 {
		if got, want := scheduled[i].Sub(scheduled[0]), time.Duration(i)*10*time.Millisecond; got != want {
			t.Errorf("flow %d due %s after the first, want %s", i, got, want)
		}
	}
	if got := Count(3, 10*time.Second); got != 30 {
		t.Errorf("Count(3/s, 10s) = %d", got)
	}
	if got := Count(0.5, 3*time.Second); got != 1 {
		t.Errorf("Count(0.5/s, 3s) = %d", got)
	}
}

// TestCoordinatedOmissionShows: with one flow in flight at a time and 50 ms per call, flows
// scheduled every 10 ms queue up; their latency counts from the scheduled time, so the
// report shows the queue (a closed loop would have reported 50 ms), and the achieved rate
// falls short of the target.
func TestCoordinatedOmissionShows(t *testing.T) {
	flow := func(ctx context.Context, tr *Trace) error {
		return tr.Step("slow", func() error { time.Sleep(50 * time.Millisecond); return nil })
	}
	cfg := Config{Rate: 100, Duration: 200 * time.Millisecond, Concurrency: 1, Drain: time.Minute,
		Mix: []Weighted{{"f", 1}}, Flows: map[string]Flow{"f": flow}}
	rec := NewRecorder()
	sum, err := Run(context.Background(), cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	rep := NewReport(cfg, sum, rec)
	slow := rep.Op("slow")
	// The 20th flow is due at 190 ms and cannot begin before 19 × 50 ms: ≥ 760 ms late.
	if slow.Count != 20 || slow.MaxMs < 750 || slow.P50Ms < 200 {
		t.Fatalf("slow %+v: the queue behind the cap does not show", slow)
	}
	if rep.StartLag.MaxMs < 700 {
		t.Fatalf("start lag %+v", rep.StartLag)
	}
	if sum.StartedInWindow >= 10 || rep.AchievedRate >= 50 {
		t.Fatalf("achieved %.1f/s with %d started in the window: want far below the 100/s target", rep.AchievedRate, sum.StartedInWindow)
	}
}

// TestDrainCancels: a flow that never ends is cancelled after Drain and counted failed.
func TestDrainCancels(t *testing.T) {
	flow := func(ctx context.Context, tr *Trace) error {
		return tr.Step("stuck", func() error { <-ctx.Done(); return ctx.Err() })
	}
	cfg := Config{Rate: 10, Duration: 200 * time.Millisecond, Concurrency: 1, Drain: 200 * time.Millisecond,
		Mix: []Weighted{{"f", 1}}, Flows: map[string]Flow{"f": flow}}
	rec := NewRecorder()
	sum, err := Run(context.Background(), cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Scheduled != 2 || sum.Failed != 2 || sum.Completed != 0 {
		t.Fatalf("%+v", sum)
	}
	_, errs := rec.Ops()
	n := 0
	for _, e := range errs {
		if e.Code != "cancelled" {
			t.Errorf("error %+v", e)
		}
		n += e.Count
	}
	if n != 2 {
		t.Fatalf("errors %+v, want 2 cancelled", errs)
	}
}

func TestMix(t *testing.T) {
	known := []string{"a", "b", "c"}
	mix, err := ParseMix("a=6, b=3,c", known)
	if err != nil {
		t.Fatal(err)
	}
	p := newPicker(mix)
	got := map[string]int{}
	var seq strings.Builder
	for range 20 {
		n := p.next()
		got[n]++
		seq.WriteString(n)
	}
	if got["a"] != 12 || got["b"] != 6 || got["c"] != 2 {
		t.Fatalf("two cycles dealt %v (%s), want a:12 b:6 c:2", got, seq.String())
	}
	if strings.Contains(seq.String()[:10], "aaaa") {
		t.Errorf("not smooth: %s", seq.String())
	}
	for _, bad := range []string{"", "x=1", "a=-1", "a=z", "a=0", "a=1,a=2"} {
		if _, err := ParseMix(bad, known); err == nil {
			t.Errorf("ParseMix(%q) accepted", bad)
		}
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	l := Summarize(ds)
	if l.P50Ms != 50 || l.P99Ms != 99 || l.MaxMs != 100 {
		t.Fatalf("%+v", l)
	}
	if l := Summarize([]time.Duration{7 * time.Millisecond}); l.P50Ms != 7 || l.P99Ms != 7 || l.MaxMs != 7 {
		t.Fatalf("one value: %+v", l)
	}
	if l := Summarize(nil); l != (Latency{}) {
		t.Fatalf("none: %+v", l)
	}
	// Nearest rank: of 10 values, p99 is the largest, p50 the 5th.
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if Percentile(ten, 0.99) != 10 || Percentile(ten, 0.5) != 5 {
		t.Fatalf("p99 %v p50 %v", Percentile(ten, 0.99), Percentile(ten, 0.5))
	}
}

func TestRecorderErrors(t *testing.T) {
	rec := NewRecorder()
	rec.Observe("create", 3*time.Millisecond, nil)
	rec.Observe("create", 0, fmt.Errorf("wrapped: %w", &client.Error{Status: 429, Code: "concurrency_limit"}))
	rec.Observe("create", 0, &client.Error{Status: 429, Code: "concurrency_limit"})
	rec.Observe("exec", 0, context.DeadlineExceeded)
	rec.Observe("exec", 0, &CheckError{Code: "exec_wrong_answer", Err: errors.New("exit 1")})
	rec.Observe("delete", 0, errors.New("connection refused"))
	ops, errs := rec.Ops()
	if len(ops) != 3 || ops[0].Op != "create" || ops[0].Count != 3 || ops[0].Errors != 2 || ops[0].P99Ms != 3 {
		t.Fatalf("ops %+v", ops)
	}
	if errs[0] != (ErrCount{ErrKey{"create", 429, "concurrency_limit"}, 2}) {
		t.Fatalf("errors %+v", errs)
	}
	want := map[ErrKey]bool{{"exec", 0, "timeout"}: true, {"exec", 0, "exec_wrong_answer"}: true, {"delete", 0, "transport"}: true}
	for _, e := range errs[1:] {
		if !want[e.ErrKey] {
			t.Errorf("unexpected %+v", e)
		}
		delete(want, e.ErrKey)
	}
	if len(want) > 0 {
		t.Errorf("missing %v", want)
	}
}

// TestCheckLeaks: a session that never stops, a slot held, a guest left or a check that
// cannot be made each count as a leak; what drains within the settle time does not.
func TestCheckLeaks(t *testing.T) {
	ctx := context.Background()
	zero := func(context.Context) (int64, error) { return 0, nil }
	noGuests := func(context.Context) (map[string][]string, error) {
		return map[string][]string{"node_1": nil, "node_2": {}}, nil
	}
	calls := 0
	draining := func(context.Context) ([]string, error) {
		calls++
		if calls < 3 {
			return []string{"sess_a"}, nil
		}
		return nil, nil
	}
	l := CheckLeaks(ctx, LeakSources{ActiveSessions: draining, RedisSlots: zero, Guests: noGuests}, 10*time.Second, time.Millisecond)
	if l.Any() || calls != 3 || l.RedisSlots == nil || *l.RedisSlots != 0 {
		t.Fatalf("drained after %d checks: %+v", calls, l)
	}
	if !strings.HasPrefix(l.String(), "none (0 active sessions, 0 Redis concurrency slots, 0 guests on 2 nodes") {
		t.Fatalf("%s", l)
	}
	stuck := func(context.Context) ([]string, error) { return []string{"sess_stuck"}, nil }
	for name, src := range map[string]LeakSources{
		"session": {ActiveSessions: stuck},
		"slot":    {RedisSlots: func(context.Context) (int64, error) { return 1, nil }},
		"guest": {Guests: func(context.Context) (map[string][]string, error) {
			return map[string][]string{"node_2": {"sess_g"}}, nil
		}},
		"unchecked": {RedisSlots: func(context.Context) (int64, error) { return 0, errors.New("connection refused") }},
	} {
		start := time.Now()
		l := CheckLeaks(ctx, src, 50*time.Millisecond, time.Millisecond)
		if !l.Any() || !strings.HasPrefix(l.String(), "LEAKED") {
			t.Errorf("%s: not a leak: %s", name, l)
		}
		if time.Since(start) < 50*time.Millisecond {
			t.Errorf("%s: gave up before the settle time", name)
		}
	}
	l = CheckLeaks(ctx, LeakSources{ActiveSessions: stuck}, 0, time.Millisecond)
	if !strings.Contains(l.String(), "1 active sessions sess_stuck") || !strings.Contains(l.String(), "not checked") {
		t.Fatalf("%s", l)
	}
}

func TestReportText(t *testing.T) {
	rec := NewRecorder()
	for i := 1; i <= 10; i++ {
		rec.Observe("create", time.Duration(i)*time.Millisecond, nil)
	}
	rec.Observe("create", 0, &client.Error{Status: 503, Code: "unavailable"})
	cfg := Config{Rate: 5, Duration: 2 * time.Second, Concurrency: 8, Mix: []Weighted{{"create-exec-delete", 1}}}
	rep := NewReport(cfg, Summary{Scheduled: 10, StartedInWindow: 10, Completed: 9, Failed: 1, Window: 2 * time.Second}, rec)
	rep.Baseline = []OpStats{{Op: "GET /healthz", Count: 10, Latency: Latency{P50Ms: 0.5, P99Ms: 2, MaxMs: 2}}}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"target 5.00 flows/s, achieved 5.00/s", "10 scheduled", "9 completed, 1 failed",
		"p99 create / p99 GET /healthz: 5.0x", "leaks: none"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	rows := map[string]bool{}
	for line := range strings.Lines(out) {
		rows[strings.Join(strings.Fields(line), " ")] = true
	}
	for _, want := range []string{"op count errors p50 ms p99 ms max ms", "create 11 1 5.0 10.0 10.0",
		"baseline GET /healthz 10 0 0.5 2.0 2.0", "create 503 unavailable 1"} {
		if !rows[want] {
			t.Errorf("table lacks the row %q:\n%s", want, out)
		}
	}
}
