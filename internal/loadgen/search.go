package loadgen

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// SearchConfig is a search for the highest rate that meets a goal.
type SearchConfig struct {
	Start, Max float64 // the first rate tried, and the highest
	// Precision ends the search when the rate that failed is within this factor of the one
	// that passed (1.25: within 25 %).
	Precision float64
	// CreateP99 is the goal: create's p99 at most this, with no failed flow and no leak.
	CreateP99 time.Duration
}

// Step is one rate's run: the report, or an error when the run could not be made at all.
type Step func(ctx context.Context, rate float64) (*Report, error)

// SearchStep is one rate tried and what it showed.
type SearchStep struct {
	Rate        float64 `json:"rate"`
	CreateP50Ms float64 `json:"create_p50_ms"`
	CreateP99Ms float64 `json:"create_p99_ms"`
	// BaselineP99Ms is the first baseline's p99 measured before this step, at its rate.
	BaselineP99Ms float64 `json:"baseline_p99_ms,omitempty"`
	FailedFlows   int     `json:"failed_flows"`
	Leaked        bool    `json:"leaked"`
	Pass          bool    `json:"pass"`
	Why           string  `json:"why,omitempty"`
}

// SearchResult is the search's outcome: Best is the highest rate that passed (0: none did).
type SearchResult struct {
	CreateP99Ms float64      `json:"goal_create_p99_ms"`
	Best        float64      `json:"best_rate"`
	Steps       []SearchStep `json:"steps"`
	Reports     []*Report    `json:"reports"`
}

// judge says whether a step's report meets the goal, and why not.
func judge(rate float64, r *Report, goal time.Duration) SearchStep {
	c := r.Op("create")
	s := SearchStep{Rate: rate, CreateP50Ms: c.P50Ms, CreateP99Ms: c.P99Ms, FailedFlows: r.Flows.Failed, Leaked: r.Leaks.Any()}
	if len(r.Baseline) > 0 {
		s.BaselineP99Ms = r.Baseline[0].P99Ms
	}
	var why []string
	if c.Count == 0 {
		why = append(why, "no create succeeded")
	}
	if goalMs := float64(goal) / float64(time.Millisecond); c.P99Ms > goalMs {
		why = append(why, fmt.Sprintf("create p99 %.1f ms > %.1f ms", c.P99Ms, goalMs))
	}
	if r.Flows.Failed > 0 {
		why = append(why, fmt.Sprintf("%d flows failed", r.Flows.Failed))
	}
	if s.Leaked {
		why = append(why, "leaked: "+r.Leaks.String())
	}
	s.Pass, s.Why = len(why) == 0, strings.Join(why, "; ")
	return s
}

// Search finds the highest rate that meets the goal: it doubles the rate from Start until a
// step fails (or Max passes), or, when Start itself fails, halves it (three times at most)
// until one passes; then it halves the gap between the highest pass and the lowest failure
// until they are within Precision. Latency grows with load, so one failure bounds
// the search from above; a noisy machine can make that bound low, which the table shows.
func Search(ctx context.Context, cfg SearchConfig, step Step) (*SearchResult, error) {
	if cfg.Start <= 0 || cfg.Max < cfg.Start {
		return nil, fmt.Errorf("search: want 0 < start ≤ max, got start %v, max %v", cfg.Start, cfg.Max)
	}
	if cfg.Precision <= 1 {
		cfg.Precision = 1.25
	}
	res := &SearchResult{CreateP99Ms: float64(cfg.CreateP99) / float64(time.Millisecond)}
	try := func(rate float64) (bool, error) {
		r, err := step(ctx, rate)
		if err != nil {
			return false, fmt.Errorf("search: the run at %g flows/s: %w", rate, err)
		}
		s := judge(rate, r, cfg.CreateP99)
		res.Steps, res.Reports = append(res.Steps, s), append(res.Reports, r)
		if s.Pass && rate > res.Best {
			res.Best = rate
		}
		return s.Pass, nil
	}
	pass, fail := 0.0, 0.0
	for rate := cfg.Start; ; rate = min(rate*2, cfg.Max) {
		ok, err := try(rate)
		if err != nil {
			return res, err
		}
		if !ok {
			fail = rate
			break
		}
		pass = rate
		if rate >= cfg.Max {
			return res, nil
		}
	}
	// The first rate failed: halve it, down to an eighth of it, until one passes (a busy
	// machine's start that was too high still finds a rate and its table).
	for half := cfg.Start / 2; pass == 0 && half >= cfg.Start/8; half /= 2 {
		rate := roundRate(half)
		ok, err := try(rate)
		if err != nil {
			return res, err
		}
		if ok {
			pass = rate
		} else {
			fail = rate
		}
	}
	for pass > 0 && fail/pass > cfg.Precision {
		mid := roundRate((pass + fail) / 2)
		if mid <= pass || mid >= fail {
			break
		}
		ok, err := try(mid)
		if err != nil {
			return res, err
		}
		if ok {
			pass = mid
		} else {
			fail = mid
		}
	}
	return res, nil
}

// roundRate keeps rates readable: two significant decimals.
func roundRate(r float64) float64 {
	return float64(int64(r*100+0.5)) / 100
}

// WriteText prints the steps, the outcome and the whole table of the best rate's run.
func (s *SearchResult) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "wb load --search: the highest rate with create p99 ≤ %.1f ms, no failed flow and no leak\n\n", s.CreateP99Ms)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "flows/s\tcreate p50 ms\tcreate p99 ms\tbaseline p99 ms\tfailed flows\tresult\n")
	for _, st := range s.Steps {
		res := "pass"
		if !st.Pass {
			res = "fail: " + st.Why
		}
		base := "-"
		if st.BaselineP99Ms > 0 {
			base = fmt.Sprintf("%.1f", st.BaselineP99Ms)
		}
		fmt.Fprintf(tw, "%g\t%.1f\t%.1f\t%s\t%d\t%s\n", st.Rate, st.CreateP50Ms, st.CreateP99Ms, base, st.FailedFlows, res)
	}
	tw.Flush()
	best := slices.IndexFunc(s.Steps, func(st SearchStep) bool { return st.Pass && st.Rate == s.Best })
	if best < 0 || best >= len(s.Reports) {
		b.WriteString("\nno rate tried met the goal\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	fmt.Fprintf(&b, "\nhighest rate that met the goal: %g flows/s; its run:\n\n", s.Best)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	return s.Reports[best].WriteText(w)
}
