package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"wb/client"
)

// Weighted is one entry of a mix: a flow's name and its share of the schedule.
type Weighted struct {
	Name   string `json:"name"`
	Weight int    `json:"weight"`
}

// ParseMix reads "name=weight,name=weight" (a bare name weighs 1); every name must be one of
// known, and at least one weight must be positive.
func ParseMix(s string, known []string) ([]Weighted, error) {
	var out []Weighted
	total := 0
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, hasW := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		weight := 1
		if hasW {
			n, err := strconv.Atoi(strings.TrimSpace(w))
			if err != nil || n < 0 {
				return nil, fmt.Errorf("mix: weight of %q: want a whole number ≥ 0, got %q", name, w)
			}
			weight = n
		}
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("mix: unknown flow %q; known: %s", name, strings.Join(known, ", "))
		}
		if slices.ContainsFunc(out, func(x Weighted) bool { return x.Name == name }) {
			return nil, fmt.Errorf("mix: flow %q given twice", name)
		}
		out = append(out, Weighted{name, weight})
		total += weight
	}
	if total == 0 {
		return nil, fmt.Errorf("mix: %q has no flow with a positive weight", s)
	}
	return out, nil
}

// picker deals the flows of a mix in smooth weighted round robin (nginx's): deterministic, and
// the shares are exact over every whole cycle, so a short run gets the mix it asked for.
type picker struct {
	items   []Weighted
	current []int
	total   int
}

func newPicker(mix []Weighted) *picker {
	p := &picker{items: mix, current: make([]int, len(mix))}
	for _, w := range mix {
		p.total += w.Weight
	}
	return p
}

func (p *picker) next() string {
	best := -1
	for i, w := range p.items {
		p.current[i] += w.Weight
		if best < 0 || p.current[i] > p.current[best] {
			best = i
		}
	}
	p.current[best] -= p.total
	return p.items[best].Name
}

// Flow is one scheduled unit of work (e.g. create → exec → delete); it measures each call
// with tr.Step.
type Flow func(ctx context.Context, tr *Trace) error

// Trace measures the calls of one flow.
type Trace struct {
	rec       *Recorder
	scheduled time.Time
	started   bool
	// Index is the flow's place in the schedule (0, 1, …): flows pick a gateway with it.
	Index int
}

// Step makes one call and records its latency under op: the flow's first call counts from
// the flow's scheduled time (so queueing behind the in-flight cap or a late scheduler shows),
// later calls from their own start.
func (t *Trace) Step(op string, call func() error) error {
	from := time.Now()
	if !t.started {
		from, t.started = t.scheduled, true
	}
	err := call()
	t.rec.Observe(op, time.Since(from), err)
	return err
}

// Config is one run.
type Config struct {
	// Rate is the flows started per second; Duration the window in which they are scheduled.
	Rate     float64
	Duration time.Duration
	// Concurrency caps the flows in flight; a flow past the cap waits for a slot, and the
	// wait counts in its first call's latency.
	Concurrency int
	Mix         []Weighted
	Flows       map[string]Flow
	// Drain bounds the wait for the flows still in flight when the window ends; then their
	// context is cancelled.
	Drain time.Duration
}

// Summary is what Run saw of the schedule itself.
type Summary struct {
	Scheduled int `json:"scheduled"`
	// StartedInWindow counts the flows that got a slot and began before the window ended.
	StartedInWindow int           `json:"started_in_window"`
	Completed       int           `json:"completed"`
	Failed          int           `json:"failed"`
	Window          time.Duration `json:"-"`
	// ByFlow counts each flow's runs and failures.
	ByFlow map[string]*FlowCount `json:"by_flow"`
}

// FlowCount is one flow's tally.
type FlowCount struct {
	Runs   int `json:"runs"`
	Failed int `json:"failed"`
}

// Scheduled answers the time flow i is due: start + i/rate, computed from start every time so
// that a late wake-up never pushes the rest of the schedule back.
func Scheduled(start time.Time, rate float64, i int) time.Time {
	return start.Add(time.Duration(float64(i) * float64(time.Second) / rate))
}

// Count is the number of flows a window holds: floor(rate · duration).
func Count(rate float64, d time.Duration) int {
	return int(math.Floor(rate*d.Seconds() + 1e-9))
}

// Run schedules cfg's flows open-loop, waits for them (up to cfg.Drain), and records every
// call in rec.
func Run(ctx context.Context, cfg Config, rec *Recorder) (Summary, error) {
	if cfg.Rate <= 0 || math.IsInf(cfg.Rate, 0) || math.IsNaN(cfg.Rate) {
		return Summary{}, fmt.Errorf("loadgen: rate must be > 0, got %v", cfg.Rate)
	}
	if cfg.Concurrency < 1 {
		return Summary{}, fmt.Errorf("loadgen: concurrency must be ≥ 1, got %d", cfg.Concurrency)
	}
	for _, w := range cfg.Mix {
		if cfg.Flows[w.Name] == nil {
			return Summary{}, fmt.Errorf("loadgen: mix names flow %q, which has no implementation", w.Name)
		}
	}
	if len(cfg.Mix) == 0 {
		return Summary{}, errors.New("loadgen: empty mix")
	}
	n := Count(cfg.Rate, cfg.Duration)
	sum := Summary{Scheduled: n, ByFlow: map[string]*FlowCount{}}
	for _, w := range cfg.Mix {
		sum.ByFlow[w.Name] = &FlowCount{}
	}
	flowCtx, cancelFlows := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelFlows()
	sem := make(chan struct{}, cfg.Concurrency)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		windowAt time.Time // the end of the window, once known
	)
	pick := newPicker(cfg.Mix)
	start := time.Now()
	end := start.Add(cfg.Duration)
	timer := time.NewTimer(0)
	<-timer.C
schedule:
	for i := range n {
		at := Scheduled(start, cfg.Rate, i)
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				timer.Stop()
				sum.Scheduled = i
				break schedule
			case <-timer.C:
			}
		}
		name := pick.next()
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-flowCtx.Done():
				mu.Lock()
				sum.Failed++
				sum.ByFlow[name].Runs++
				sum.ByFlow[name].Failed++
				mu.Unlock()
				rec.Observe("flow-start", time.Since(at), flowCtx.Err())
				return
			}
			defer func() { <-sem }()
			began := time.Now()
			rec.lag(began.Sub(at))
			err := cfg.Flows[name](flowCtx, &Trace{rec: rec, scheduled: at, Index: i})
			mu.Lock()
			defer mu.Unlock()
			if !began.After(end) {
				sum.StartedInWindow++
			}
			sum.ByFlow[name].Runs++
			if err != nil {
				sum.Failed++
				sum.ByFlow[name].Failed++
			} else {
				sum.Completed++
			}
		}()
	}
	// The window is the schedule's length, not the time the last flow took: an overloaded
	// scheduler that fires late stretches it, and the achieved rate shows that.
	windowAt = time.Now()
	if windowAt.Before(end) && ctx.Err() == nil {
		windowAt = end
	}
	sum.Window = windowAt.Sub(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	drain := time.NewTimer(cfg.Drain)
	defer drain.Stop()
	select {
	case <-done:
	case <-drain.C:
		cancelFlows()
		<-done
	}
	return sum, nil
}

// Classify names an error the way the report groups it: the HTTP status and the API's error
// code when the server answered, else 0 and what went wrong on the client's side.
func Classify(err error) (status int, code string) {
	var apiErr *client.Error
	switch {
	case errors.As(err, &apiErr):
		return apiErr.Status, apiErr.Code
	case errors.Is(err, context.DeadlineExceeded):
		return 0, "timeout"
	case errors.Is(err, context.Canceled):
		return 0, "cancelled"
	}
	var ce *CheckError
	if errors.As(err, &ce) {
		return 0, ce.Code
	}
	return 0, "transport"
}

// CheckError is a call that the server answered with success but whose answer was wrong (an
// exec's exit code, a session that failed instead of running).
type CheckError struct {
	Code string
	Err  error
}

func (e *CheckError) Error() string { return e.Code + ": " + e.Err.Error() }
func (e *CheckError) Unwrap() error { return e.Err }
