package loadgen

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeStep answers reports whose create p99 grows with the rate (1 ms per flow/s), failing
// flows past failAbove, and records the rates tried.
func fakeStep(tried *[]float64, failAbove float64) Step {
	return func(_ context.Context, rate float64) (*Report, error) {
		*tried = append(*tried, rate)
		r := &Report{TargetRate: rate, Ops: []OpStats{{Op: "create", Count: 10, Latency: Latency{P50Ms: rate / 2, P99Ms: rate}}},
			Baseline: []OpStats{{Op: "healthz", Count: 10, Latency: Latency{P99Ms: 0.5}}}}
		if rate > failAbove {
			r.Flows.Failed = 1
		}
		return r, nil
	}
}

func TestSearchFindsTheHighestRateWithinPrecision(t *testing.T) {
	var tried []float64
	res, err := Search(context.Background(), SearchConfig{Start: 1, Max: 100, Precision: 1.1, CreateP99: 13 * time.Millisecond}, fakeStep(&tried, 1000))
	if err != nil {
		t.Fatal(err)
	}
	// Doubling: 1, 2, 4, 8 pass, 16 fails (p99 16 > 13); then bisect 12 (pass), 14 (fail), 13 (pass).
	if want := []float64{1, 2, 4, 8, 16, 12, 14, 13}; !slices.Equal(tried, want) {
		t.Fatalf("tried %v, want %v", tried, want)
	}
	if res.Best != 13 {
		t.Fatalf("best %v, want 13", res.Best)
	}
	last := res.Steps[len(res.Steps)-2]
	if last.Pass || !strings.Contains(last.Why, "create p99 14.0 ms > 13.0 ms") {
		t.Fatalf("the step at 14: %+v", last)
	}
	var b strings.Builder
	if err := res.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "highest rate that met the goal: 13 flows/s") || !strings.Contains(b.String(), "0.5") {
		t.Fatalf("table:\n%s", b.String())
	}
	// Then the whole table of the run at 13 flows/s, as a run at one rate prints it.
	var run strings.Builder
	if err := res.Reports[len(res.Reports)-1].WriteText(&run); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(b.String(), run.String()) || !strings.Contains(run.String(), "target 13.00 flows/s") {
		t.Fatalf("the search's output does not end with its best run's table:\n%s\n--- the run at 13 flows/s:\n%s", b.String(), run.String())
	}
}

func TestSearchFailedFlowsAndLimits(t *testing.T) {
	var tried []float64
	// Failed flows fail a step even when the latency is fine.
	res, err := Search(context.Background(), SearchConfig{Start: 2, Max: 100, Precision: 1.5, CreateP99: time.Second}, fakeStep(&tried, 5))
	if err != nil {
		t.Fatal(err)
	}
	if res.Best != 4 || !strings.Contains(res.Steps[2].Why, "1 flows failed") {
		t.Fatalf("best %v, steps %+v", res.Best, res.Steps)
	}
	// The maximum passes: the search stops there.
	tried = nil
	res, err = Search(context.Background(), SearchConfig{Start: 3, Max: 10, CreateP99: time.Second}, fakeStep(&tried, 1000))
	if err != nil || res.Best != 10 || !slices.Equal(tried, []float64{3, 6, 10}) {
		t.Fatalf("best %v tried %v err %v", res.Best, tried, err)
	}
	// The first rate fails: the search goes down, halving, until one passes, then closes in.
	tried = nil
	res, err = Search(context.Background(), SearchConfig{Start: 20, Max: 100, CreateP99: 10 * time.Millisecond}, fakeStep(&tried, 1000))
	if err != nil || res.Best != 10 || !slices.Equal(tried, []float64{20, 10, 15, 12.5}) {
		t.Fatalf("best %v tried %v err %v", res.Best, tried, err)
	}
	// Down to an eighth of the first rate at most: then no rate met the goal.
	tried = nil
	res, err = Search(context.Background(), SearchConfig{Start: 100, Max: 100, CreateP99: 10 * time.Millisecond}, fakeStep(&tried, 1000))
	if err != nil || res.Best != 0 || !slices.Equal(tried, []float64{100, 50, 25, 12.5}) {
		t.Fatalf("best %v tried %v err %v", res.Best, tried, err)
	}
	// A run that cannot be made ends the search with its error; bad bounds are refused.
	boom := errors.New("boom")
	if _, err := Search(context.Background(), SearchConfig{Start: 1, Max: 2}, func(context.Context, float64) (*Report, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if _, err := Search(context.Background(), SearchConfig{Start: 0, Max: 2}, fakeStep(&tried, 1)); err == nil {
		t.Fatal("start 0 accepted")
	}
}
