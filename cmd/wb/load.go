package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/client"
	"wb/internal/cli"
	"wb/internal/loadgen"
	"wb/session"
	"wb/store"
)

// loadFlows are the flows `wb load --mix` may name.
func loadFlows() []string { return []string{"create-exec-delete", "run", "pause-resume"} }

const defaultLoadMix = "create-exec-delete=6,run=3,pause-resume=1"

// exitLeaked is wb load's exit code when the run left something behind (or a check could not
// be made): distinct from 2, a run that could not be made at all.
const exitLeaked = 3

// loadOpts are wb load's settings once parsed.
type loadOpts struct {
	urls          []string
	key           string
	rate          float64
	duration      time.Duration
	mix           []loadgen.Weighted
	tier          int
	concurrency   int
	redisURL      string
	settle, drain time.Duration
	callTimeout   time.Duration
	poll          time.Duration
	baseline      time.Duration
	output        string
	fleet         bool
	fleetRuntime  string
	fleetDir      string
	searchP99     time.Duration
	searchMax     float64
}

type urlList []string

func (u *urlList) String() string { return strings.Join(*u, ",") }
func (u *urlList) Set(v string) error {
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*u = append(*u, p)
		}
	}
	return nil
}

// loadCmd is `wb load`: the public API driven open-loop at a fixed rate through the Go SDK,
// then a table of latencies, errors and leaks (package loadgen).
func loadCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wb load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o loadOpts
	var urls urlList
	fs.Var(&urls, "url", "gateway base `URL`; repeat or give a comma list to spread the flows round-robin over several (default $WB_URLS, else $WB_URL)")
	fs.StringVar(&o.key, "key", os.Getenv("WB_API_KEY"), "the project's API `key` (default $WB_API_KEY); use a project of its own: every active session in it counts as a leak")
	fs.Float64Var(&o.rate, "rate", 5, "flows started per `second`, by the clock (open loop)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "the window in which flows are scheduled")
	mix := fs.String("mix", defaultLoadMix, "the flows and their weights: create-exec-delete, run (an ephemeral tier-1 run of sh), pause-resume (create, pause, resume, delete)")
	fs.IntVar(&o.tier, "tier", 1, "the tier of the sessions created (pause-resume uses at least 2: tier 1 cannot pause)")
	fs.IntVar(&o.concurrency, "concurrency", 64, "cap on the flows in flight; a flow past it waits, and the wait counts in its latency")
	fs.StringVar(&o.redisURL, "redis", os.Getenv("WB_REDIS_URL"), "Redis `URL` of the deployment (default $WB_REDIS_URL): also check that the project holds no concurrency slot after the run")
	fs.DurationVar(&o.settle, "settle", time.Minute, "how long deleted sessions may take to stop before what is left counts as leaked")
	fs.DurationVar(&o.drain, "drain", 2*time.Minute, "how long flows still in flight at the end of the window may take to finish")
	fs.DurationVar(&o.callTimeout, "call-timeout", time.Minute, "deadline of each API call (and of a session's wait to run)")
	fs.DurationVar(&o.poll, "poll", 50*time.Millisecond, "how often a new session is polled (GET) until it runs: the resolution of ready, and load of its own")
	fs.DurationVar(&o.baseline, "baseline", 5*time.Second, "before the load, measure this long at the same rate a no-op HTTP call (GET /healthz) and, with --redis, a Redis PING, as a baseline; 0: none")
	fs.StringVar(&o.output, "o", "text", "output: text (the table) or json")
	fs.BoolVar(&o.fleet, "fleet", false, "start a fleet on this machine (2 gateways, 3 nodes, Redis Cluster; as wb fleet, with no warm pool), run against both gateways, also check every node's guests, then stop it")
	fs.StringVar(&o.fleetRuntime, "fleet-runtime", "runc", "with --fleet: the nodes' guest runtime")
	fs.StringVar(&o.fleetDir, "fleet-dir", "", "with --fleet: the fleet's `dir` (default: a new one under /tmp)")
	fs.DurationVar(&o.searchP99, "search-p99", 0, "search for the highest rate whose create p99 is at most this `duration`, with no failed flow and no leak: from --rate, doubling (or halving, to an eighth at most, when --rate fails), then halving the gap to within 25 %; each step runs --duration and prints its table on stderr, and the output ends with the best rate's; 0: one run at --rate")
	fs.Float64Var(&o.searchMax, "search-max", 64, "with --search-p99: the highest rate tried, in flows per `second`")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: wb load [flags]

Drives the public API open-loop: flows (e.g. create → exec → delete) start at a fixed rate by
the clock, whatever the server does, spread round-robin over the gateways; a flow's first call
is measured from its scheduled time, so stalls show as latency (no coordinated omission).
At the end every session it created is deleted, and it checks that none of the project's
sessions is left active (the API's list), with --redis that the project holds no concurrency
slot, and with --fleet that no node has a guest left.

Prints per operation (create, ready = created → running, exec, run, pause, resume, delete) the
count, errors and p50/p99/max latency; errors by HTTP status and code; the achieved rate
against the target; a baseline; and the leaks. Calls are not retried: a 429 or 503 is an error.
Exit code 0, or 3 when anything leaked (or could not be checked), 2 when the run failed.

  wb load --url $WB_URL --key $WB_API_KEY --rate 10 --duration 30s --redis redis://...
  wb load --fleet --rate 8 --duration 60s
  wb load --fleet --rate 1 --duration 60s --search-p99 10ms      (make bench-fleet)

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("wb load takes no arguments, got %q", fs.Args())
	}
	var err error
	if o.mix, err = loadgen.ParseMix(*mix, loadFlows()); err != nil {
		return fmt.Errorf("--mix: %w", err)
	}
	if o.output != "text" && o.output != "json" {
		return fmt.Errorf("-o: want text or json, got %q", o.output)
	}
	if o.tier < 1 || o.tier > 4 {
		return fmt.Errorf("--tier: want 1–4, got %d", o.tier)
	}
	if o.rate <= 0 {
		return fmt.Errorf("--rate: want > 0, got %v", o.rate)
	}
	if o.poll <= 0 {
		return fmt.Errorf("--poll: want > 0, got %s", o.poll)
	}
	if o.concurrency < 1 {
		return fmt.Errorf("--concurrency: want ≥ 1, got %d", o.concurrency)
	}
	if o.searchP99 < 0 || (o.searchP99 > 0 && o.searchMax < o.rate) {
		return fmt.Errorf("--search-p99 %s, --search-max %g: want a duration ≥ 0 and a maximum ≥ --rate (%g)", o.searchP99, o.searchMax, o.rate)
	}
	o.urls = urls
	if len(o.urls) == 0 && !o.fleet {
		env := os.Getenv("WB_URLS")
		if env == "" {
			env = os.Getenv("WB_URL")
		}
		_ = urls.Set(env)
		o.urls = urls
	}
	if !o.fleet {
		if len(o.urls) == 0 {
			return errors.New("--url: no gateway given (nor $WB_URLS, $WB_URL)")
		}
		if o.key == "" {
			return errors.New("--key: no API key given (nor $WB_API_KEY)")
		}
	}
	var reps []*loadgen.Report
	var search *loadgen.SearchResult
	err = withLoadTarget(ctx, o, stderr, func(o loadOpts, rdb redis.UniversalClient, guests guestLister) error {
		if o.searchP99 == 0 {
			rep, err := runLoad(ctx, o, rdb, guests)
			reps = append(reps, rep)
			return err
		}
		var err error
		search, err = loadgen.Search(ctx, loadgen.SearchConfig{Start: o.rate, Max: o.searchMax, CreateP99: o.searchP99},
			func(ctx context.Context, rate float64) (*loadgen.Report, error) {
				step := o
				step.rate = rate
				fmt.Fprintf(stderr, "load: search: %g flows/s for %s\n", rate, o.duration)
				rep, err := runLoad(ctx, step, rdb, guests)
				if err == nil {
					_ = rep.WriteText(stderr)
				}
				return rep, err
			})
		if search != nil {
			reps = search.Reports
		}
		return err
	})
	if err != nil {
		return err
	}
	switch {
	case search != nil && o.output == "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(search)
	case search != nil:
		err = search.WriteText(stdout)
	default:
		err = writeLoadReport(stdout, o.output, reps[0])
	}
	if err != nil {
		return err
	}
	for _, rep := range reps {
		if err := loadOutcome(rep); err != nil {
			return err
		}
	}
	return nil
}

// guestLister lists every node's guests (nil: the nodes cannot be reached from here).
type guestLister func(context.Context) (map[string][]string, error)

// withLoadTarget calls body with the deployment to load: with --fleet a fleet it starts and
// stops around it, else --url's gateways (and --redis's Redis, when given).
func withLoadTarget(ctx context.Context, o loadOpts, stderr io.Writer, body func(loadOpts, redis.UniversalClient, guestLister) error) error {
	if o.fleet {
		return loadOnFleet(ctx, o, stderr, body)
	}
	var rdb redis.UniversalClient
	if o.redisURL != "" {
		var err error
		if rdb, err = dialRedis(o.redisURL, ""); err != nil {
			return fmt.Errorf("--redis %s: %w", redisLabel(o.redisURL), err)
		}
		defer rdb.Close()
	}
	return body(o, rdb, nil)
}

// loadOutcome is the run's exit: exitLeaked when anything was left behind.
func loadOutcome(rep *loadgen.Report) error {
	if rep.Leaks.Any() {
		return &cli.ExitError{Code: exitLeaked, Err: fmt.Errorf("load: leaks: %s", rep.Leaks)}
	}
	return nil
}

func writeLoadReport(w io.Writer, format string, rep *loadgen.Report) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteText(w)
}

// loadTarget is what the flows call: an SDK client per gateway, picked round-robin by the
// flow's place in the schedule.
type loadTarget struct {
	o       loadOpts
	clients []*client.Client
	hc      *http.Client

	mu      sync.Mutex
	created map[string]bool // session id → deleted by its flow
}

func (t *loadTarget) client(i int) *client.Client { return t.clients[i%len(t.clients)] }

func (t *loadTarget) noteCreated(id string) {
	t.mu.Lock()
	if _, ok := t.created[id]; !ok {
		t.created[id] = false
	}
	t.mu.Unlock()
}

func (t *loadTarget) noteDeleted(id string) {
	t.mu.Lock()
	t.created[id] = true
	t.mu.Unlock()
}

// runLoad runs the baseline, the load, the final deletes and the leak checks. rdb (nil: none)
// reaches the deployment's Redis; guests (nil: none) lists the nodes' guests.
func runLoad(ctx context.Context, o loadOpts, rdb redis.UniversalClient, guests guestLister) (*loadgen.Report, error) {
	// One transport with room for every flow in flight: the default keeps 2 idle connections
	// per host, and new TCP connections would be measured as the API's latency.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 0, o.concurrency*2
	tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	hc := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	t := &loadTarget{o: o, hc: hc, created: map[string]bool{}}
	for _, u := range o.urls {
		c, err := client.New(u, o.key, client.WithHTTPClient(hc), client.WithRetries(1, 0), client.WithUserAgent("wb-load"))
		if err != nil {
			return nil, fmt.Errorf("--url %s: %w", u, err)
		}
		t.clients = append(t.clients, c)
	}
	// Fail early on a wrong key or URL rather than after a minute of 401s.
	for i, c := range t.clients {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := c.ListSessions(cctx, client.ListSessionsRequest{Page: client.Page{Limit: 1}})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("load: gateway %s: %w", o.urls[i], err)
		}
	}
	var projectID string
	if rdb != nil {
		p, err := store.New(rdb).Authenticate(ctx, o.key)
		if err != nil {
			return nil, fmt.Errorf("load: the key's project in Redis: %w", err)
		}
		projectID = p.ID
	}

	var baseline []loadgen.OpStats
	if o.baseline > 0 {
		var err error
		if baseline, err = runBaseline(ctx, o, t, rdb); err != nil {
			return nil, err
		}
	}

	cfg := loadgen.Config{Rate: o.rate, Duration: o.duration, Concurrency: o.concurrency, Mix: o.mix, Drain: o.drain,
		Flows: map[string]loadgen.Flow{
			"create-exec-delete": t.createExecDelete,
			"run":                t.ephemeralRun,
			"pause-resume":       t.pauseResume,
		}}
	rec := loadgen.NewRecorder()
	sum, err := loadgen.Run(ctx, cfg, rec)
	if err != nil {
		return nil, err
	}
	// Every session a flow created and did not delete (it failed half-way, or was cut off):
	// deleted now, outside the measured calls.
	cleanCtx := context.WithoutCancel(ctx)
	t.mu.Lock()
	var left []string
	for id, deleted := range t.created {
		if !deleted {
			left = append(left, id)
		}
	}
	t.mu.Unlock()
	for _, id := range left {
		cctx, cancel := context.WithTimeout(cleanCtx, o.callTimeout)
		_, err := t.clients[0].DeleteSession(cctx, id)
		cancel()
		var apiErr *client.Error
		if err != nil && !(errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound) {
			rec.Observe("cleanup-delete", 0, err)
		}
	}

	rep := loadgen.NewReport(cfg, sum, rec)
	rep.Gateways, rep.Baseline = o.urls, baseline
	src := loadgen.LeakSources{ActiveSessions: func(ctx context.Context) ([]string, error) {
		return activeSessions(ctx, t.clients[0])
	}, Guests: guests}
	if rdb != nil {
		st := store.New(rdb)
		src.RedisSlots = func(ctx context.Context) (int64, error) { return st.ActiveCount(ctx, projectID) }
	}
	rep.Leaks = loadgen.CheckLeaks(cleanCtx, src, o.settle, 250*time.Millisecond)
	return rep, nil
}

// activeSessions lists the project's sessions in every state that is not terminal.
func activeSessions(ctx context.Context, c *client.Client) ([]string, error) {
	var ids []string
	for _, st := range session.States() {
		if st.Terminal() {
			continue
		}
		for s, err := range c.AllSessions(ctx, client.ListSessionsRequest{State: st, Page: client.Page{Limit: 100}}) {
			if err != nil {
				return ids, err
			}
			if !slices.Contains(ids, s.ID) {
				ids = append(ids, s.ID)
			}
		}
	}
	return ids, nil
}

// runBaseline measures, open-loop at the load's rate, what the machine costs without wb's
// work: GET /healthz on the gateways (HTTP, the Go runtime, loopback) and a Redis PING.
func runBaseline(ctx context.Context, o loadOpts, t *loadTarget, rdb redis.UniversalClient) ([]loadgen.OpStats, error) {
	var calls atomic.Int64 // each gateway in turn (the flow's index alternates with PING's)
	flows := map[string]loadgen.Flow{
		"GET /healthz": func(ctx context.Context, tr *loadgen.Trace) error {
			u := strings.TrimRight(o.urls[int(calls.Add(1)-1)%len(o.urls)], "/") + "/healthz"
			return tr.Step("GET /healthz", func() error {
				ctx, cancel := context.WithTimeout(ctx, o.callTimeout)
				defer cancel()
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
				if err != nil {
					return err
				}
				resp, err := t.hc.Do(req)
				if err != nil {
					return err
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return &loadgen.CheckError{Code: fmt.Sprintf("status_%d", resp.StatusCode), Err: errors.New("GET /healthz")}
				}
				return nil
			})
		},
	}
	mix := []loadgen.Weighted{{Name: "GET /healthz", Weight: 1}}
	if rdb != nil {
		flows["redis PING"] = func(ctx context.Context, tr *loadgen.Trace) error {
			return tr.Step("redis PING", func() error {
				ctx, cancel := context.WithTimeout(ctx, o.callTimeout)
				defer cancel()
				return rdb.Ping(ctx).Err()
			})
		}
		mix = append(mix, loadgen.Weighted{Name: "redis PING", Weight: 1})
	}
	rec := loadgen.NewRecorder()
	// Each baseline call at the load's own rate: the mix's calls take turns.
	cfg := loadgen.Config{Rate: o.rate * float64(len(mix)), Duration: o.baseline, Concurrency: o.concurrency, Mix: mix, Flows: flows, Drain: o.drain}
	if _, err := loadgen.Run(ctx, cfg, rec); err != nil {
		return nil, fmt.Errorf("load: baseline: %w", err)
	}
	ops, _ := rec.Ops()
	return ops, nil
}

func (t *loadTarget) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, t.o.callTimeout)
}

// createRunning creates a session on the flow's gateway and waits for it to run, recording
// "create" (the POST) and "ready" (its answer → running, polled every --poll).
func (t *loadTarget) createRunning(ctx context.Context, tr *loadgen.Trace, tier int) (string, error) {
	c := t.client(tr.Index)
	var s *client.Session
	err := tr.Step("create", func() error {
		ctx, cancel := t.callCtx(ctx)
		defer cancel()
		var err error
		s, err = c.CreateSession(ctx, client.CreateSessionRequest{Tier: tier, Metadata: map[string]string{"wb_load": "1"}})
		return err
	})
	if err != nil {
		return "", err
	}
	t.noteCreated(s.ID)
	err = tr.Step("ready", func() error {
		ctx, cancel := t.callCtx(ctx)
		defer cancel()
		for {
			cur, err := c.GetSession(ctx, s.ID)
			if err != nil {
				return err
			}
			switch {
			case cur.State == session.Running:
				return nil
			case cur.State.Terminal() || cur.State == session.Stopping:
				reason := "unknown"
				if cur.StateReason != nil {
					reason = string(*cur.StateReason)
				}
				return &loadgen.CheckError{Code: "session_" + string(cur.State) + "_" + reason, Err: fmt.Errorf("session %s is %s (%s), never running", s.ID, cur.State, reason)}
			}
			timer := time.NewTimer(t.o.poll)
			select {
			case <-ctx.Done():
				timer.Stop()
				return ctx.Err()
			case <-timer.C:
			}
		}
	})
	return s.ID, err
}

func (t *loadTarget) delete(ctx context.Context, tr *loadgen.Trace, id string) error {
	err := tr.Step("delete", func() error {
		ctx, cancel := t.callCtx(ctx)
		defer cancel()
		_, err := t.client(tr.Index).DeleteSession(ctx, id)
		return err
	})
	if err == nil {
		t.noteDeleted(id)
	}
	return err
}

func (t *loadTarget) createExecDelete(ctx context.Context, tr *loadgen.Trace) error {
	id, err := t.createRunning(ctx, tr, t.o.tier)
	if err == nil {
		err = tr.Step("exec", func() error {
			ctx, cancel := t.callCtx(ctx)
			defer cancel()
			res, err := t.client(tr.Index).Exec(ctx, id, client.ExecRequest{Command: "echo ok"})
			if err == nil && (res.ExitCode != 0 || res.Stdout != "ok\n") {
				return &loadgen.CheckError{Code: "exec_wrong_answer", Err: fmt.Errorf("exit %d, stdout %q", res.ExitCode, res.Stdout)}
			}
			return err
		})
	}
	if id == "" {
		return err
	}
	return errors.Join(err, t.delete(ctx, tr, id))
}

func (t *loadTarget) ephemeralRun(ctx context.Context, tr *loadgen.Trace) error {
	return tr.Step("run", func() error {
		ctx, cancel := t.callCtx(ctx)
		defer cancel()
		run, err := t.client(tr.Index).CreateRun(ctx, client.CreateRunRequest{Tier: 1, Runtime: "sh", Code: "echo ok"})
		if err != nil {
			return err
		}
		if run.SessionID != nil {
			// The gateway deletes an ephemeral run's session itself; noted so the leak check
			// names it if it did not.
			t.noteCreated(*run.SessionID)
			t.noteDeleted(*run.SessionID)
		}
		if run.State != session.RunSucceeded || run.Stdout != "ok\n" {
			return &loadgen.CheckError{Code: "run_" + run.State, Err: fmt.Errorf("run %s: %s, stdout %q", run.ID, run.State, run.Stdout)}
		}
		return nil
	})
}

func (t *loadTarget) pauseResume(ctx context.Context, tr *loadgen.Trace) error {
	id, err := t.createRunning(ctx, tr, max(t.o.tier, 2))
	if err == nil {
		err = tr.Step("pause", func() error {
			ctx, cancel := t.callCtx(ctx)
			defer cancel()
			_, err := t.client(tr.Index).PauseSession(ctx, id)
			return err
		})
	}
	if err == nil {
		err = tr.Step("resume", func() error {
			ctx, cancel := t.callCtx(ctx)
			defer cancel()
			_, err := t.client(tr.Index).ResumeSession(ctx, id)
			return err
		})
	}
	if id == "" {
		return err
	}
	return errors.Join(err, t.delete(ctx, tr, id))
}
