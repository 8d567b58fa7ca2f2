package suite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"sync"
	"time"

	"wb/client"
)

// Row is one row of a seed's table and the check of it.
type Row struct {
	Seed  string // "000" or "001"
	Table string // the table's title as the seed writes it
	Row   string // the row as the seed writes it (and what of it is checked)
	// Long rows need the seed's real timers: short mode skips them.
	Long bool
	// Serial rows run after all the others, one at a time: they change what the project's
	// other sessions live under (its spend cap).
	Serial bool
	// Skip, when set, says why the row cannot be checked through the API; it is reported
	// as SKIP with this reason.
	Skip string
	// Timeout bounds the check (0: DefaultRowTimeout); Timers gives the timers in force, for
	// rows that wait on them.
	Timeout func(Timers) time.Duration
	// Check drives the deployment through e.C and answers what it saw; an error fails the row.
	Check func(ctx context.Context, e *Env) (saw string, err error)
}

// Name is "seed/table/row", what Options.Filter matches.
func (r Row) Name() string { return r.Seed + "/" + r.Table + "/" + r.Row }

// DefaultRowTimeout bounds a row that sets no Timeout: a cold session start on a loaded
// machine and a few calls.
const DefaultRowTimeout = 4 * time.Minute

// Timers are the session timers the suite's timer rows use.
type Timers struct {
	IdleTimeoutS int `json:"idle_timeout_s"`
	MaxLifetimeS int `json:"max_lifetime_s"`
}

// ShortTimers are the smallest timers the API accepts (seed 000, "Timeouts": 30 s and 60 s).
var shortTimers = Timers{IdleTimeoutS: 30, MaxLifetimeS: 60}

// longTimers are the seed's defaults.
var longTimers = Timers{IdleTimeoutS: 300, MaxLifetimeS: 3600}

// Options say what to check and where.
type Options struct {
	URL, Key string
	// Long uses the seed's timers and runs the rows that need them.
	Long bool
	// Filter, when set, runs only the rows whose Name it matches (the rest are left out).
	Filter *regexp.Regexp
	// Parallel bounds the rows run at once (0: 8). Nine timer rows spend 30–60 s each waiting
	// for a timer to fire: at 4 they held the slots, and a run took 134 s; at 8, 94 s.
	Parallel int
	// Rows to run (nil: Rows()).
	Rows []Row
	// HTTPClient, when set, carries the SDK's requests.
	HTTPClient *http.Client
	// Log receives progress (nil: none).
	Log *slog.Logger
}

// Status is a row's outcome.
type Status string

const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	Skip Status = "SKIP"
)

// Result is one row's outcome.
type Result struct {
	Seed     string        `json:"seed"`
	Table    string        `json:"table"`
	Row      string        `json:"row"`
	Status   Status        `json:"status"`
	Saw      string        `json:"saw"`
	Duration time.Duration `json:"duration_ns"`
}

// Report is the outcome of a run, rows in the suite's order.
type Report struct {
	URL      string        `json:"url"`
	Long     bool          `json:"long"`
	Timers   Timers        `json:"timers"`
	Results  []Result      `json:"results"`
	Passed   int           `json:"passed"`
	Failed   int           `json:"failed"`
	Skipped  int           `json:"skipped"`
	Duration time.Duration `json:"duration_ns"`
	// Leftovers are objects the suite made and could not delete at the end.
	Leftovers []string `json:"leftovers,omitempty"`
}

// OK reports whether no row failed and nothing was left behind.
func (r Report) OK() bool { return r.Failed == 0 && len(r.Leftovers) == 0 }

// Run checks the rows against the deployment at opts.URL. Rows run in parallel, at most
// opts.Parallel at once, each under its own timeout; what each made is deleted when it ends,
// and what rows shared when all have. The error is for options that cannot run at all.
func Run(ctx context.Context, opts Options) (Report, error) {
	var copts []client.Option
	if opts.HTTPClient != nil {
		copts = append(copts, client.WithHTTPClient(opts.HTTPClient))
	}
	c, err := client.New(opts.URL, opts.Key, append(copts, client.WithUserAgent("wb-conformance"))...)
	if err != nil {
		return Report{}, fmt.Errorf("conformance: %w", err)
	}
	rows := opts.Rows
	if rows == nil {
		rows = Rows()
	}
	if opts.Filter != nil {
		var kept []Row
		for _, r := range rows {
			if opts.Filter.MatchString(r.Name()) {
				kept = append(kept, r)
			}
		}
		rows = kept
	}
	parallel := opts.Parallel
	if parallel <= 0 {
		parallel = 8
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timers := shortTimers
	if opts.Long {
		timers = longTimers
	}
	s := &suiteState{c: c, long: opts.Long, timers: timers, tag: "wbconf_" + randomHex(6), log: log,
		fixtures: map[string]*fixture{}}
	start := time.Now()
	rep := Report{URL: opts.URL, Long: opts.Long, Timers: timers, Results: make([]Result, len(rows))}
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, row := range rows {
		if row.Serial {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			rep.Results[i] = s.runRow(ctx, row)
			log.Info("row", "name", row.Name(), "status", rep.Results[i].Status, "saw", rep.Results[i].Saw)
		})
	}
	wg.Wait()
	for i, row := range rows {
		if row.Serial {
			rep.Results[i] = s.runRow(ctx, row)
			log.Info("row", "name", row.Name(), "status", rep.Results[i].Status, "saw", rep.Results[i].Saw)
		}
	}
	rep.Leftovers = s.shared.cleanup(c)
	for _, r := range rep.Results {
		switch r.Status {
		case Pass:
			rep.Passed++
		case Fail:
			rep.Failed++
		default:
			rep.Skipped++
		}
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// suiteState is what the rows of one run share.
type suiteState struct {
	c      *client.Client
	long   bool
	timers Timers
	tag    string // end_user_id of every session the run makes, to tell them apart
	log    *slog.Logger
	shared tracker // objects made by fixtures: deleted when every row has ended

	mu       sync.Mutex
	fixtures map[string]*fixture
}

func (s *suiteState) runRow(ctx context.Context, row Row) (res Result) {
	res = Result{Seed: row.Seed, Table: row.Table, Row: row.Row}
	switch {
	case row.Skip != "":
		res.Status, res.Saw = Skip, "skipped ("+row.Skip+")"
		return res
	case row.Long && !s.long:
		res.Status, res.Saw = Skip, "skipped (needs --long)"
		return res
	case row.Check == nil:
		res.Status, res.Saw = Skip, "skipped (no check)"
		return res
	}
	timeout := DefaultRowTimeout
	if row.Timeout != nil {
		timeout = row.Timeout(s.timers)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	e := &Env{C: s.c, Long: s.long, Timers: s.timers, suite: s}
	start := time.Now()
	saw, err := func() (saw string, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("the check panicked: %v", p)
			}
		}()
		return row.Check(rctx, e)
	}()
	res.Duration = time.Since(start)
	if left := e.own.cleanup(s.c); len(left) > 0 {
		err = errors.Join(err, fmt.Errorf("could not delete what the row made: %v", left))
	}
	res.Status, res.Saw = Pass, saw
	if err != nil {
		res.Status = Fail
		if errors.Is(err, context.DeadlineExceeded) && rctx.Err() != nil {
			err = fmt.Errorf("%w (the row's timeout is %s)", err, timeout)
		}
		res.Saw = err.Error()
		if saw != "" {
			res.Saw = saw + "; " + res.Saw
		}
	}
	return res
}

// fixture is a setup several rows share, made by the first row that asks for it.
type fixture struct {
	mu   sync.Mutex
	done bool
	val  any
	err  error
}

// shared answers the fixture name, making it with make the first time (a failed make is
// remembered: every row that shares it fails with its error). Objects make creates through
// the Env it is given are deleted when the whole run ends.
func shared[T any](ctx context.Context, e *Env, name string, make func(ctx context.Context, e *Env) (T, error)) (T, error) {
	s := e.suite
	s.mu.Lock()
	f := s.fixtures[name]
	if f == nil {
		f = &fixture{}
		s.fixtures[name] = f
	}
	s.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.done {
		fe := &Env{C: e.C, Long: e.Long, Timers: e.Timers, suite: s, sharedOwner: true}
		v, err := make(ctx, fe)
		if err != nil && ctx.Err() != nil {
			var zero T
			return zero, err // this row ran out of time: let the next one try
		}
		f.val, f.err, f.done = v, err, true
	}
	if f.err != nil {
		var zero T
		return zero, fmt.Errorf("shared setup %q: %w", name, f.err)
	}
	return f.val.(T), nil
}

// tracker remembers what a row (or the fixtures) made, to delete it.
type tracker struct {
	mu                            sync.Mutex
	sessions, snapshots, desktops []string
}

func (t *tracker) add(list *[]string, id string) {
	t.mu.Lock()
	*list = append(*list, id)
	t.mu.Unlock()
}

// cleanup deletes every session, snapshot and desktop recorded, with a context of its own
// (the row's may have ended), and answers what it could not delete.
func (t *tracker) cleanup(c *client.Client) []string {
	t.mu.Lock()
	sessions, snapshots, desktops := t.sessions, t.snapshots, t.desktops
	t.sessions, t.snapshots, t.desktops = nil, nil, nil
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var left []string
	gone := func(err error) bool {
		var apiErr *client.Error
		return err == nil || errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound
	}
	for _, id := range sessions {
		if _, err := c.DeleteSession(ctx, id); !gone(err) {
			left = append(left, id+" ("+err.Error()+")")
		}
	}
	for _, id := range desktops {
		if _, err := c.DeleteDesktop(ctx, id); !gone(err) {
			left = append(left, id+" ("+err.Error()+")")
		}
	}
	// Snapshots last: a restore in flight may still read one.
	for _, id := range snapshots {
		if _, err := c.DeleteSnapshot(ctx, id); !gone(err) {
			left = append(left, id+" ("+err.Error()+")")
		}
	}
	return left
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
