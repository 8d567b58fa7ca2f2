package loadgen

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Recorder collects latencies and errors; safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	order []string // ops in the order first seen
	ok    map[string][]time.Duration
	fails map[string]int
	errs  map[ErrKey]int
	lags  []time.Duration
}

// ErrKey groups errors: the op, the HTTP status (0: none) and the code.
type ErrKey struct {
	Op     string `json:"op"`
	Status int    `json:"status"`
	Code   string `json:"code"`
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{ok: map[string][]time.Duration{}, fails: map[string]int{}, errs: map[ErrKey]int{}}
}

// Observe records one call of op: its latency when it succeeded, its class when it failed.
func (r *Recorder) Observe(op string, d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.ok[op]; !seen {
		r.order = append(r.order, op)
		r.ok[op] = nil
	}
	if err != nil {
		r.fails[op]++
		status, code := Classify(err)
		r.errs[ErrKey{op, status, code}]++
		return
	}
	r.ok[op] = append(r.ok[op], d)
}

func (r *Recorder) lag(d time.Duration) {
	r.mu.Lock()
	r.lags = append(r.lags, d)
	r.mu.Unlock()
}

// Latency is a distribution's summary in milliseconds.
type Latency struct {
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

// OpStats is one operation's row: its calls, failures, and the latency of the calls that
// succeeded.
type OpStats struct {
	Op     string `json:"op"`
	Count  int    `json:"count"`
	Errors int    `json:"errors"`
	Latency
}

// ErrCount is one row of the error table.
type ErrCount struct {
	ErrKey
	Count int `json:"count"`
}

// Percentile answers the nearest-rank p-quantile (0 < p ≤ 1) of sorted: the smallest value
// with at least p of the values at or below it; 0 when empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p*float64(len(sorted)) - 1e-9))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Summarize answers the p50, p99 and max of ds (which it sorts).
func Summarize(ds []time.Duration) Latency {
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
	if len(ds) == 0 {
		return Latency{}
	}
	return Latency{P50Ms: ms(Percentile(ds, 0.50)), P99Ms: ms(Percentile(ds, 0.99)), MaxMs: ms(ds[len(ds)-1])}
}

// Ops answers a row per op, in the order first seen, and the error table, most frequent first.
func (r *Recorder) Ops() ([]OpStats, []ErrCount) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ops []OpStats
	for _, op := range r.order {
		ds := slices.Clone(r.ok[op])
		ops = append(ops, OpStats{Op: op, Count: len(ds) + r.fails[op], Errors: r.fails[op], Latency: Summarize(ds)})
	}
	var errs []ErrCount
	for k, n := range r.errs {
		errs = append(errs, ErrCount{k, n})
	}
	slices.SortFunc(errs, func(a, b ErrCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Op, b.Op), cmp.Compare(a.Status, b.Status), cmp.Compare(a.Code, b.Code))
	})
	return ops, errs
}

// StartLag summarizes how late flows began after their scheduled time (the scheduler's own
// lateness plus the wait for a slot under the in-flight cap).
func (r *Recorder) StartLag() Latency {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Summarize(slices.Clone(r.lags))
}

// Leaks is what a run left behind. A nil field was not checked.
type Leaks struct {
	// ActiveSessions are the project's sessions in a state other than stopped, failed or
	// expired, as the API lists them.
	ActiveSessions []string `json:"active_sessions"`
	// RedisSlots is the project's concurrency slots held in Redis.
	RedisSlots *int64 `json:"redis_slots,omitempty"`
	// Guests are the guests each node's runtime still has, by node id.
	Guests map[string][]string `json:"guests,omitempty"`
	// CheckErrors are the checks that could not be made: a leak not ruled out.
	CheckErrors []string `json:"check_errors,omitempty"`
}

// Any reports whether anything leaked or could not be checked.
func (l Leaks) Any() bool {
	if len(l.ActiveSessions) > 0 || len(l.CheckErrors) > 0 || (l.RedisSlots != nil && *l.RedisSlots != 0) {
		return true
	}
	for _, g := range l.Guests {
		if len(g) > 0 {
			return true
		}
	}
	return false
}

// LeakSources are the checks; a nil one is skipped.
type LeakSources struct {
	ActiveSessions func(context.Context) ([]string, error)
	RedisSlots     func(context.Context) (int64, error)
	Guests         func(context.Context) (map[string][]string, error)
}

// CheckLeaks asks every source until all are clean or settle has passed (deleted sessions
// take a moment to stop and release their slot), and answers what it saw last.
func CheckLeaks(ctx context.Context, src LeakSources, settle, every time.Duration) Leaks {
	deadline := time.Now().Add(settle)
	for {
		l := checkOnce(ctx, src)
		if !l.Any() || time.Now().After(deadline) || ctx.Err() != nil {
			return l
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

func checkOnce(ctx context.Context, src LeakSources) Leaks {
	var l Leaks
	if src.ActiveSessions != nil {
		ids, err := src.ActiveSessions(ctx)
		if err != nil {
			l.CheckErrors = append(l.CheckErrors, fmt.Sprintf("list sessions: %v", err))
		}
		l.ActiveSessions = ids
	}
	if src.RedisSlots != nil {
		n, err := src.RedisSlots(ctx)
		if err != nil {
			l.CheckErrors = append(l.CheckErrors, fmt.Sprintf("redis slots: %v", err))
		} else {
			l.RedisSlots = &n
		}
	}
	if src.Guests != nil {
		g, err := src.Guests(ctx)
		if err != nil {
			l.CheckErrors = append(l.CheckErrors, fmt.Sprintf("guests: %v", err))
		}
		l.Guests = g
	}
	return l
}

// Report is a run's outcome, as the table prints it and -o json encodes it.
type Report struct {
	TargetRate   float64    `json:"target_rate"`
	AchievedRate float64    `json:"achieved_rate"`
	DurationS    float64    `json:"duration_s"`
	Concurrency  int        `json:"concurrency"`
	Gateways     []string   `json:"gateways"`
	Mix          []Weighted `json:"mix"`
	Flows        Summary    `json:"flows"`
	StartLag     Latency    `json:"start_lag"`
	Ops          []OpStats  `json:"ops"`
	Errors       []ErrCount `json:"errors"`
	// Baseline is measured in the same run, before the load, at the same rate: what the
	// machine itself costs (a no-op HTTP call, a Redis round trip).
	Baseline []OpStats `json:"baseline,omitempty"`
	Leaks    Leaks     `json:"leaks"`
}

// NewReport assembles a report of a run.
func NewReport(cfg Config, sum Summary, rec *Recorder) *Report {
	ops, errs := rec.Ops()
	r := &Report{TargetRate: cfg.Rate, DurationS: cfg.Duration.Seconds(), Concurrency: cfg.Concurrency, Mix: cfg.Mix,
		Flows: sum, StartLag: rec.StartLag(), Ops: ops, Errors: errs}
	if sum.Window > 0 {
		r.AchievedRate = math.Round(float64(sum.StartedInWindow)/sum.Window.Seconds()*100) / 100
	}
	if r.Errors == nil {
		r.Errors = []ErrCount{}
	}
	return r
}

// Op answers the row of op (zero when absent).
func (r *Report) Op(name string) OpStats {
	for _, o := range r.Ops {
		if o.Op == name {
			return o
		}
	}
	return OpStats{Op: name}
}

// WriteText prints the table.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	mix := make([]string, len(r.Mix))
	for i, m := range r.Mix {
		mix[i] = fmt.Sprintf("%s=%d", m.Name, m.Weight)
	}
	fmt.Fprintf(&b, "wb load: %gs open loop, target %.2f flows/s, achieved %.2f/s; mix %s; %d gateway(s); in-flight cap %d\n",
		r.DurationS, r.TargetRate, r.AchievedRate, strings.Join(mix, ","), len(r.Gateways), r.Concurrency)
	fmt.Fprintf(&b, "flows: %d scheduled, %d started in the window, %d completed, %d failed\n",
		r.Flows.Scheduled, r.Flows.StartedInWindow, r.Flows.Completed, r.Flows.Failed)
	fmt.Fprintf(&b, "start lag (scheduled → began): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n\n", r.StartLag.P50Ms, r.StartLag.P99Ms, r.StartLag.MaxMs)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(o OpStats) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t\n", o.Op, o.Count, o.Errors, o.P50Ms, o.P99Ms, o.MaxMs)
	}
	fmt.Fprintf(tw, "op\tcount\terrors\tp50 ms\tp99 ms\tmax ms\t\n")
	for _, o := range r.Ops {
		row(o)
	}
	for _, o := range r.Baseline {
		o.Op = "baseline " + o.Op
		row(o)
	}
	tw.Flush()
	if create := r.Op("create"); len(r.Baseline) > 0 && create.Count > 0 {
		for _, o := range r.Baseline {
			if o.P99Ms > 0 {
				fmt.Fprintf(&b, "p99 create / p99 %s: %.1fx\n", o.Op, create.P99Ms/o.P99Ms)
			}
		}
	}
	b.WriteString("(latency of the calls that succeeded; a flow's first call counts from its scheduled time;\n" +
		" ready = create's answer → running (polled); baseline = measured in the same run, before the load, at the same rate)\n")
	if len(r.Errors) > 0 {
		b.WriteString("\nerrors:\n")
		tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "op\tstatus\tcode\tcount\n")
		for _, e := range r.Errors {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", e.Op, e.Status, e.Code, e.Count)
		}
		tw.Flush()
	} else {
		b.WriteString("\nerrors: none\n")
	}
	b.WriteString("\nleaks: ")
	b.WriteString(r.Leaks.String())
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// String is the leaks' line of the table.
func (l Leaks) String() string {
	var parts []string
	parts = append(parts, fmt.Sprintf("%d active sessions", len(l.ActiveSessions)))
	if len(l.ActiveSessions) > 0 {
		parts[0] += " " + strings.Join(l.ActiveSessions[:min(len(l.ActiveSessions), 10)], " ")
	}
	if l.RedisSlots != nil {
		parts = append(parts, fmt.Sprintf("%d Redis concurrency slots", *l.RedisSlots))
	} else {
		parts = append(parts, "Redis slots not checked (no --redis)")
	}
	if l.Guests != nil {
		n := 0
		var ids []string
		nodes := make([]string, 0, len(l.Guests))
		for node := range l.Guests {
			nodes = append(nodes, node)
		}
		slices.Sort(nodes)
		for _, node := range nodes {
			n += len(l.Guests[node])
			for _, g := range l.Guests[node] {
				ids = append(ids, node+"/"+g)
			}
		}
		s := fmt.Sprintf("%d guests on %d nodes", n, len(l.Guests))
		if n > 0 {
			s += " " + strings.Join(ids[:min(len(ids), 10)], " ")
		}
		parts = append(parts, s)
	}
	for _, e := range l.CheckErrors {
		parts = append(parts, "NOT CHECKED: "+e)
	}
	verdict := "none"
	if l.Any() {
		verdict = "LEAKED"
	}
	return verdict + " (" + strings.Join(parts, ", ") + ")"
}
