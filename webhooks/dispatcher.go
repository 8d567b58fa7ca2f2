package webhooks

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
	"wb/store"
)

// Group is the consumer group the dispatcher reads each project's outbox with, and the
// outbox signals (store.WorkOutbox) with.
const Group = "webhooks"

// outboxConsumer is the one consumer of Group in every project's outbox. Only the dispatcher
// holding the outbox reads or acknowledges it, so the consumer needs no name of its own:
// whoever takes the hold next finds the entries a dispatcher that died left pending with one
// read from "0", and no dead consumer is left behind per dispatcher run.
const outboxConsumer = "dispatcher"

const (
	readCount    = 100              // outbox entries per XREADGROUP, and signals per read
	readRounds   = 10               // XREADGROUP calls per handling of a project at most
	maxWait      = 30 * time.Second // longest wait for a signal or a due delivery
	retryPause   = time.Second      // after a failed read of the signals
	redisTimeout = 5 * time.Second  // for the writes that must finish even when stopping
	leaseMargin  = 30 * time.Second
	maxBodyRead  = 64 << 10
	maxErrLen    = 500
)

// Options configure a Dispatcher. Zero values take the defaults.
type Options struct {
	// HTTPClient sends the deliveries. Default: a client with Timeout that does not follow
	// redirects (a 3xx is a failure) and dials through the registry's guard, so that every
	// new connection to an endpoint is resolved, checked and dialled like egress (unless the
	// registry allows private addresses). A client given here is used as it is.
	HTTPClient *http.Client
	// Timeout bounds one attempt (default 10 s).
	Timeout time.Duration
	// Consumer names this dispatcher in the consumer group of the outbox signals
	// (default host-pid).
	Consumer string
	// Backoff is the wait after the attempt-th failed attempt of a delivery
	// (default DefaultBackoff).
	Backoff func(attempt int) time.Duration
	// RetryWindow: a delivery is given up when an attempt made at least this long after its
	// first attempt fails (default 24 h), so it is retried for at least that long.
	RetryWindow time.Duration
	// ClaimIdle is how long a project's outbox stays held by a dispatcher that stopped
	// renewing its hold (it died reading it) (default 30 s).
	ClaimIdle time.Duration
	// SweepInterval is how often every project is checked for work whose signal was lost (a
	// writer that died between its write and its signal) (default 5 min); the first check is
	// at start.
	SweepInterval time.Duration
	// Concurrency bounds the deliveries in flight (default 32). The N projects that have work
	// may each hold Concurrency/(N+1) of it (a lone project half), so one project's slow
	// endpoints never hold every slot and another's deliveries start at once.
	Concurrency int
	// MaxQueuedBytes bounds the deliveries queued for one endpoint, in bytes of Redis, for
	// all its sessions together (default DefaultMaxQueuedBytes). An event that would take an
	// endpoint past it is not queued for that endpoint (others still get it), and its
	// delivery log says so.
	MaxQueuedBytes int64
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Now replaces time.Now for timestamps and schedules.
	Now func() time.Time
}

// DefaultMaxQueuedBytes is Options.MaxQueuedBytes's default: 8 MiB. An endpoint that fails
// keeps its deliveries queued for a day, so a project's worst case in Redis is its endpoints
// (DefaultMaxEndpoints, 16) times this, 128 MiB, however fast its events come.
const DefaultMaxQueuedBytes = 8 << 20

// DefaultBackoff waits 5 s after the first failure and doubles each time up to 1 h per wait,
// less a random jitter of up to 20 %. With the default 24 h RetryWindow that makes about 35
// attempts.
func DefaultBackoff(attempt int) time.Duration { return backoff(attempt, DefaultMaxBackoff) }

// DefaultMaxBackoff is DefaultBackoff's longest wait between two attempts.
const DefaultMaxBackoff = time.Hour

// BackoffUpTo is DefaultBackoff with its waits capped at most (at least 1 ms): an endpoint that
// comes back is retried at most about that long after (an operator's choice: wb serve
// --webhook-max-backoff).
func BackoffUpTo(most time.Duration) func(attempt int) time.Duration {
	most = max(most, time.Millisecond)
	return func(attempt int) time.Duration { return backoff(attempt, most) }
}

func backoff(attempt int, most time.Duration) time.Duration {
	lo, hi := BackoffRange(attempt, most)
	return hi - rand.N(hi-lo+1)
}

// BackoffRange answers the bounds of the wait after the attempt-th failed attempt when the
// waits are capped at most (DefaultMaxBackoff for DefaultBackoff): 5 s doubled per attempt up
// to most, less a jitter of up to 20 %. Tests derive from it how long after an outage an
// endpoint hears again.
func BackoffRange(attempt int, most time.Duration) (lo, hi time.Duration) {
	most = max(most, time.Millisecond)
	d := 5 * time.Second
	for i := 1; i < attempt && d < most; i++ {
		d *= 2
	}
	d = min(d, most)
	return d - d/5, d
}

func (o Options) withDefaults(reg *Registry) Options {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.HTTPClient == nil && reg != nil {
		o.HTTPClient = &http.Client{
			Transport: reg.transport(),
			Timeout:   o.Timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		}
	}
	if o.Consumer == "" {
		host, _ := os.Hostname()
		o.Consumer = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff
	}
	if o.RetryWindow <= 0 {
		o.RetryWindow = 24 * time.Hour
	}
	if o.ClaimIdle <= 0 {
		o.ClaimIdle = 30 * time.Second
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = 5 * time.Minute
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 32
	}
	if o.MaxQueuedBytes <= 0 {
		o.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Dispatcher delivers every project's public events to its endpoints.
//
// It works only when told to: it blocks on a read of the outbox signals (consumer group
// Group, shared by every dispatcher, so each signal goes to one of them) until a project's
// outbox has events, or until the first project of the global due set (store.WebhooksDueKey)
// has a delivery due, and then handles exactly those projects. An idle platform costs a few
// commands per maxWait, however many projects it has.
//
// A project's outbox is read by one dispatcher at a time (a hold with a TTL, fencing every
// ack), through its consumer group Group. For each entry it appends one task per subscribed
// endpoint to the queue of (endpoint, session) and acks the entry in the same Lua script, so
// an entry is acked exactly when its deliveries are durably queued, and queued in stream
// order. Any dispatcher then leases due queues and attempts their heads; a queue's next task
// is attempted only after its head succeeded or was given up, which keeps each session's
// events in order per endpoint without blocking other sessions or endpoints.
type Dispatcher struct {
	rdb    redis.UniversalClient
	st     *store.Store
	reg    *Registry
	o      Options
	holder string // the value of a project's owner key while this dispatcher holds it
	log    *slog.Logger
	sem    chan struct{}
	public []string
	wake   chan struct{} // a delivery finished: a slot is free, a queue may be due
	swept  func()        // tests: called after each sweep

	inflight sync.WaitGroup

	fair    sync.Mutex
	busy    map[string]int  // deliveries in flight per project
	wanting map[string]bool // projects with deliveries in flight or due
}

// NewDispatcher returns a dispatcher; Run starts it.
func NewDispatcher(rdb redis.UniversalClient, reg *Registry, opts Options) *Dispatcher {
	o := opts.withDefaults(reg)
	return &Dispatcher{
		rdb: rdb, st: store.New(rdb), reg: reg, o: o,
		holder:  o.Consumer + "/" + session.NewID("", time.Now()),
		log:     o.Logger.With("component", "webhooks", "consumer", o.Consumer),
		sem:     make(chan struct{}, o.Concurrency),
		public:  PublicEvents(),
		wake:    make(chan struct{}, 1),
		swept:   func() {},
		busy:    map[string]int{},
		wanting: map[string]bool{},
	}
}

// Run delivers until ctx is cancelled, then waits for the attempts in flight (an attempt cut
// short is handed back, to be made again) and returns nil.
//
// The blocking read of the signals runs in a goroutine of its own that Run does not wait
// for: Redis cannot be told to end a blocking read when ctx ends, so it ends at most maxWait
// later (or when the client is closed), without handling what it read: it signals those
// projects anew, for the other dispatchers.
func (d *Dispatcher) Run(ctx context.Context) error {
	if d.rdb == nil || d.reg == nil {
		return errors.New("webhooks: dispatcher needs a Redis client and a registry")
	}
	defer d.o.HTTPClient.CloseIdleConnections()
	defer d.inflight.Wait()
	signals := make(chan []store.Signal)
	handled := make(chan bool)
	go d.readSignals(ctx, signals, handled)
	d.sweep(ctx)
	nextSweep := d.o.Now().Add(d.o.SweepInterval)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var dueAt time.Time // when the global due set is to be read again
	lookDue := true
	for {
		if lookDue {
			dueAt = d.o.Now().Add(d.handleDue(ctx))
		}
		lookDue = true
		timer.Reset(max(min(dueAt.Sub(d.o.Now()), nextSweep.Sub(d.o.Now())), 0))
		select {
		case <-ctx.Done():
			return nil
		case sigs := <-signals:
			ok, quiet := d.handleSignals(ctx, sigs)
			// Projects with no endpoint change no due set: the wait computed before holds
			// (unless a sweep follows).
			lookDue = !quiet
			select {
			case handled <- ok:
			case <-ctx.Done():
				return nil
			}
		case <-d.wake:
		case <-timer.C:
		}
		if ctx.Err() == nil && !d.o.Now().Before(nextSweep) {
			d.sweep(ctx)
			nextSweep = d.o.Now().Add(d.o.SweepInterval)
			lookDue = true // it puts projects with queued deliveries in the global due set
		}
	}
}

func (d *Dispatcher) nowMs() int64 { return d.o.Now().UnixMilli() }

// poke wakes Run.
func (d *Dispatcher) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// readSignals reads the outbox signals, blocking up to maxWait, and hands each batch to
// Run, waiting until Run has handled it (and acknowledged what it handled) before reading
// again, since a read answers this consumer's unacknowledged signals first.
func (d *Dispatcher) readSignals(ctx context.Context, out chan<- []store.Signal, handled <-chan bool) {
	for ctx.Err() == nil {
		sigs, err := d.st.Signals(ctx, store.WorkOutbox, Group, d.o.Consumer, maxWait, readCount)
		if ctx.Err() != nil {
			d.handBack(ctx, sigs)
			return
		}
		ok := err == nil
		if err != nil {
			d.log.Warn("read outbox signals", "err", err)
		}
		if len(sigs) > 0 {
			select {
			case out <- sigs:
			case <-ctx.Done():
				d.handBack(ctx, sigs)
				return
			}
			select {
			case ok = <-handled:
			case <-ctx.Done():
				return
			}
		}
		if !ok { // Redis failing: do not spin on it
			select {
			case <-time.After(retryPause):
			case <-ctx.Done():
				return
			}
		}
	}
}

// handBack gives signals read too late (Run has returned) back to the other dispatchers:
// it signals their projects anew and acknowledges them, since they would otherwise wait
// for this consumer to come back, or to be claimed from it.
func (d *Dispatcher) handBack(ctx context.Context, sigs []store.Signal) {
	if len(sigs) == 0 {
		return
	}
	wctx, cancel := detached(ctx)
	defer cancel()
	for _, p := range store.SignalProjects(sigs) {
		if err := d.st.Signal(wctx, store.WorkOutbox, p); err != nil {
			return
		}
	}
	_ = d.st.AckSignals(wctx, store.WorkOutbox, Group, sigs)
}

// handleSignals handles each signalled project once and acknowledges the signals of those
// it handled; ok false if any failed (their signals are read again); quiet if every project
// had no endpoint (nothing was queued). Signals left unhandled because ctx ended are handed
// back.
func (d *Dispatcher) handleSignals(ctx context.Context, sigs []store.Signal) (ok, quiet bool) {
	failed := map[string]bool{}
	quiet = true
	for _, p := range store.SignalProjects(sigs) {
		if ctx.Err() != nil {
			failed[p] = true
			continue
		}
		skipped, ok := d.handle(ctx, p, false)
		if !ok {
			failed[p] = true
		}
		quiet = quiet && skipped && ok
	}
	var done, left []store.Signal
	for _, sg := range sigs {
		if failed[sg.Project] {
			left = append(left, sg)
		} else {
			done = append(done, sg)
		}
	}
	if ctx.Err() != nil {
		d.handBack(ctx, left)
	}
	wctx, cancel := detached(ctx)
	defer cancel()
	if err := d.st.AckSignals(wctx, store.WorkOutbox, Group, done); err != nil {
		d.log.Warn("acknowledge outbox signals", "err", err)
		return false, quiet
	}
	return len(failed) == 0, quiet
}

// handleDue handles the projects of the global due set whose time has come, as many as
// there are free delivery slots, and answers how long to wait for the next one.
func (d *Dispatcher) handleDue(ctx context.Context) time.Duration {
	if ctx.Err() != nil {
		return maxWait
	}
	free := cap(d.sem) - len(d.sem)
	now := d.nowMs()
	lease := now + (d.o.Timeout + leaseMargin).Milliseconds()
	res, err := pickScript.Run(ctx, d.rdb, []string{store.WebhooksDueKey}, now, lease, free).Slice()
	if err != nil || len(res) != 2 {
		if ctx.Err() == nil {
			d.log.Warn("read due projects", "err", err)
		}
		return retryPause
	}
	picked := strs(res[0])
	for i, p := range picked {
		if ctx.Err() != nil {
			d.dueNow(ctx, picked[i:]) // hand back the leases on those not handled
			break
		}
		d.handle(ctx, p, true)
	}
	if len(picked) > 0 {
		return 0 // look again: more may be due
	}
	first, _ := res[1].(string)
	at, err := strconv.ParseFloat(first, 64)
	if err != nil || free == 0 { // nothing queued, or no slot free: a finished delivery wakes Run
		return maxWait
	}
	return min(time.Duration(int64(at)-now)*time.Millisecond, maxWait)
}

// dueNow makes projects due at once.
func (d *Dispatcher) dueNow(ctx context.Context, projects []string) {
	now := d.nowMs()
	for _, p := range projects {
		if !d.dueAt(ctx, p, now) {
			return
		}
	}
}

// dueAt makes the project due at ms at the latest (lowering its entry, which is always
// safe).
func (d *Dispatcher) dueAt(ctx context.Context, p string, ms int64) bool {
	wctx, cancel := detached(ctx)
	defer cancel()
	if err := d.rdb.ZAddLT(wctx, store.WebhooksDueKey, redis.Z{Score: float64(ms), Member: p}).Err(); err != nil {
		d.log.Warn("schedule project", "project", p, "err", err)
		return false
	}
	return true
}

func strs(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// handle moves the project's new outbox entries into delivery queues and starts its due
// deliveries; skipped: the project has no endpoint, and nothing was queued; ok false if
// Redis failed it.
func (d *Dispatcher) handle(ctx context.Context, p string, picked bool) (skipped, ok bool) {
	log := d.log.With("project", p)
	held, skipped, ok := d.consume(ctx, p, log)
	if !ok {
		skipped = false
		// Entries may be left pending: be due again shortly, whether or not a signal is.
		d.dueAt(ctx, p, d.nowMs()+retryPause.Milliseconds())
		held = true
	}
	if skipped && !picked {
		// No endpoint: nothing was queued, so the project's entry in the global due set, if
		// any (queues of endpoints deleted since), is still right.
		return true, true
	}
	return false, d.dispatch(ctx, p, picked, held, log) && ok
}

// sweep checks every project once: an outbox with entries is read (what it holds may never
// have been signalled), and a project with queued deliveries is put in the global due set
// at its earliest (it may have been dropped from it).
func (d *Dispatcher) sweep(ctx context.Context) {
	defer d.swept()
	if err := d.st.ForgetIdleConsumers(ctx, store.WorkOutbox, Group, store.IdleConsumerAge); err != nil && ctx.Err() == nil {
		d.log.Warn("forget idle consumers", "err", err)
	}
	var cursor uint64
	for ctx.Err() == nil {
		ids, next, err := d.rdb.SScan(ctx, store.ProjectsKey, cursor, "", 1000).Result()
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("sweep projects", "err", err)
			}
			return
		}
		lens := make([]*redis.IntCmd, len(ids))
		firsts := make([]*redis.ZSliceCmd, len(ids))
		_, err = d.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for i, p := range ids {
				lens[i] = pl.XLen(ctx, store.Outbox(p))
				firsts[i] = pl.ZRangeWithScores(ctx, projectKeys(p).due(), 0, 0)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			if ctx.Err() == nil {
				d.log.Warn("sweep projects", "err", err)
			}
			return
		}
		_, err = d.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for i, p := range ids {
				if z := firsts[i].Val(); len(z) > 0 {
					pl.ZAddLT(ctx, store.WebhooksDueKey, redis.Z{Score: z[0].Score, Member: p})
				}
			}
			return nil
		})
		if err != nil && ctx.Err() == nil {
			d.log.Warn("sweep projects", "err", err)
		}
		for i, p := range ids {
			if ctx.Err() == nil && lens[i].Val() > 0 {
				d.handle(ctx, p, false)
			}
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

// detached is a context for the writes that must finish even when ctx is cancelled.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), redisTimeout)
}

// consume moves the project's new outbox entries into delivery queues, holding its outbox
// meanwhile. held: another dispatcher holds it (and was asked to read it once more), or this
// one lost its hold midway, and the project's entry in the global due set was lowered to
// when the outbox must be read again; skipped: the project has no endpoint, and its new
// entries were skipped unread; ok: false if Redis failed it.
func (d *Dispatcher) consume(ctx context.Context, p string, log *slog.Logger) (held, skipped, ok bool) {
	k, stream := projectKeys(p), store.Outbox(p)
	ttl := d.o.ClaimIdle.Milliseconds()
	res, err := takeScript.Run(ctx, d.rdb, []string{k.owner(), k.again(), stream, k.endpoints()},
		d.holder, ttl, Group, outboxConsumer).Int64Slice()
	if err != nil || len(res) != 2 {
		if ctx.Err() == nil {
			log.Warn("take outbox", "err", err)
		}
		return false, false, false
	}
	switch res[0] {
	case 0:
		// Another dispatcher holds it and reads it once more before letting go (the again
		// flag). Should it die meanwhile, its hold lapses in res[1] ms: be due then.
		return true, false, d.dueAt(ctx, p, d.nowMs()+max(res[1], 0))
	case 2:
		return false, false, true // nothing to read
	case 3:
		return false, true, true // no endpoint: the new entries were skipped unread
	}
	start := ">"
	if res[1] > 0 {
		start = "0" // left pending by a dispatcher that died holding it: those first
	}
	renewAt := d.o.Now().Add(d.o.ClaimIdle / 3)
	for rounds := 0; ; rounds++ {
		if rounds == readRounds {
			// Others wait: let go, and signal the rest to be read later (by any dispatcher).
			d.letGo(ctx, p, true, log)
			if err := d.st.Signal(ctx, store.WorkOutbox, p); err != nil {
				log.Warn("signal the rest of the outbox", "err", err)
				return false, false, false
			}
			return false, false, true
		}
		if !d.o.Now().Before(renewAt) {
			if n, err := renewScript.Run(ctx, d.rdb, []string{k.owner()}, d.holder, ttl).Int(); err != nil || n == 0 {
				if err != nil && ctx.Err() == nil {
					log.Warn("renew outbox hold", "err", err)
				}
				if err != nil {
					return false, false, false
				}
				return true, false, d.lostHold(ctx, p, log)
			}
			renewAt = d.o.Now().Add(d.o.ClaimIdle / 3)
		}
		msgs, err := d.read(ctx, p, start)
		if errors.Is(err, errNotHeld) {
			return true, false, d.lostHold(ctx, p, log)
		}
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("read outbox", "err", err)
			}
			d.letGo(ctx, p, true, log)
			return false, false, false
		}
		if len(msgs) > 0 {
			if err := d.process(ctx, p, msgs, log); errors.Is(err, errNotHeld) {
				return true, false, d.lostHold(ctx, p, log)
			} else if err != nil {
				d.letGo(ctx, p, true, log)
				return false, false, false
			}
		}
		if len(msgs) == readCount {
			continue
		}
		if start == "0" {
			start = ">"
			continue
		}
		if !d.letGo(ctx, p, false, log) {
			return false, false, true
		}
		// Another dispatcher found it held meanwhile: read once more.
	}
}

// lostHold: this dispatcher's hold lapsed while it read the outbox (it stalled for
// ClaimIdle). Another may have taken it, or none: the project is made due at once, so that
// whichever dispatcher picks it reads what is left. Always ok.
func (d *Dispatcher) lostHold(ctx context.Context, p string, log *slog.Logger) bool {
	log.Warn("outbox hold lapsed while reading it")
	d.dueNow(ctx, []string{p})
	return true
}

// letGo ends a read of the outbox (trimming it) unless another dispatcher asked for one
// more read and force is false; true if it asked.
func (d *Dispatcher) letGo(ctx context.Context, p string, force bool, log *slog.Logger) bool {
	k := projectKeys(p)
	wctx, cancel := detached(ctx)
	defer cancel()
	f := "0"
	if force {
		f = "1"
	}
	n, err := letGoScript.Run(wctx, d.rdb, []string{k.owner(), k.again(), store.Outbox(p)},
		d.holder, d.o.ClaimIdle.Milliseconds(), Group, f).Int()
	if err != nil {
		log.Warn("let go of outbox", "err", err)
		return false
	}
	return n == 1
}

// errNotHeld: another dispatcher holds the project's outbox now.
var errNotHeld = errors.New("outbox held by another dispatcher")

// read reads up to readCount entries: those pending from "0", new ones from ">". It reads
// nothing unless this dispatcher holds the outbox.
func (d *Dispatcher) read(ctx context.Context, p, start string) ([]redis.XMessage, error) {
	res, err := readScript.Run(ctx, d.rdb, []string{projectKeys(p).owner(), store.Outbox(p)},
		d.holder, Group, outboxConsumer, readCount, start).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if v, ok := res.(int64); ok && v == -1 {
		return nil, errNotHeld
	}
	return parseRead(res)
}

// parseRead parses an XREADGROUP reply of one stream, as a script returns it.
func parseRead(res any) ([]redis.XMessage, error) {
	streams, ok := res.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected XREADGROUP reply %T", res)
	}
	var out []redis.XMessage
	for _, st := range streams {
		pair, ok := st.([]any)
		if !ok || len(pair) != 2 {
			return nil, fmt.Errorf("unexpected XREADGROUP stream %v", st)
		}
		entries, _ := pair[1].([]any)
		for _, e := range entries {
			ent, ok := e.([]any)
			if !ok || len(ent) < 1 {
				return nil, fmt.Errorf("unexpected XREADGROUP entry %v", e)
			}
			id, _ := ent[0].(string)
			m := redis.XMessage{ID: id}
			if len(ent) > 1 {
				if fields, ok := ent[1].([]any); ok {
					m.Values = make(map[string]any, len(fields)/2)
					for i := 0; i+1 < len(fields); i += 2 {
						k, _ := fields[i].(string)
						m.Values[k] = fields[i+1]
					}
				}
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// task is one queued delivery. Body, the payload delivered as it is (and signed), is held as
// the JSON value it is: a JSON string of it escaped every quote and backslash of the payload
// again (run output, a session's metadata), which made the task (up to twice) bigger than the
// payload, and every endpoint's queue with it. decodeTask still reads such a task, queued
// before. (Dispatchers of the release before this one read both forms, so a rolling deploy
// from it loses nothing; one from an older release would: deploy that release first.)
type task struct {
	EventID   string          `json:"event_id"`
	Type      string          `json:"type"`
	SessionID string          `json:"session_id,omitempty"`
	Body      json.RawMessage `json:"body"`
}

// decodeTask reads a queued task, whichever way it was encoded: its body as the payload's
// JSON, or (a task queued by a dispatcher of before) as a JSON string of it.
func decodeTask(b []byte) (task, error) {
	var t task
	if err := json.Unmarshal(b, &t); err != nil {
		return task{}, err
	}
	if len(t.Body) > 0 && t.Body[0] == '"' {
		var body string
		if err := json.Unmarshal(t.Body, &body); err != nil {
			return task{}, err
		}
		t.Body = json.RawMessage(body)
	}
	return t, nil
}

// process queues the deliveries of msgs in order; an error when it stopped at an entry that
// must be read again (errNotHeld: by the dispatcher that holds the outbox now). Entries that go nowhere are acknowledged together at the end: they
// change nothing, so their order does not matter.
func (d *Dispatcher) process(ctx context.Context, p string, msgs []redis.XMessage, log *slog.Logger) error {
	k, stream := projectKeys(p), store.Outbox(p)
	eps, err := d.reg.list(ctx, p)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("list endpoints", "err", err)
		}
		return err
	}
	var skipped []string
	for _, m := range msgs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		names, t, enc := d.plan(m, eps, log)
		if len(names) == 0 {
			skipped = append(skipped, m.ID)
			continue
		}
		ks := []string{k.owner(), stream, k.due(), k.endpoints(), k.queued()}
		args := []any{d.holder, Group, m.ID, d.nowMs(), d.o.MaxQueuedBytes, MaxLogEntries, enc}
		for _, n := range names {
			ks = append(ks, k.queue(n))
		}
		for _, n := range names {
			ep := queueEndpoint(n)
			dl, err := d.notQueued(ep, t)
			if err != nil {
				log.Error("encode delivery", "err", err)
				return err
			}
			ks = append(ks, k.log(ep))
			args = append(args, n, ep, dl)
		}
		wctx, cancel := detached(ctx)
		res, err := enqueueScript.Run(wctx, d.rdb, ks, args...).Slice()
		cancel()
		if err != nil || len(res) == 0 {
			log.Warn("queue outbox entry", "entry", m.ID, "err", err)
			return cmp.Or(err, errors.New("queue outbox entry: empty answer"))
		}
		if code, _ := res[0].(int64); code == -1 {
			return errNotHeld
		}
		for _, ep := range strs(res[1:]) {
			log.Warn("webhook delivery not queued: the endpoint's backlog is full", "endpoint", ep,
				"event", t.EventID, "type", t.Type, "session", t.SessionID, "max_queued_bytes", d.o.MaxQueuedBytes)
		}
	}
	if len(skipped) > 0 {
		wctx, cancel := detached(ctx)
		defer cancel()
		if err := d.rdb.XAck(wctx, stream, Group, skipped...).Err(); err != nil {
			log.Warn("acknowledge outbox entries", "err", err)
			return err
		}
	}
	return nil
}

// notQueued is the delivery log entry of a task not queued for endpoint because its
// backlog is full.
func (d *Dispatcher) notQueued(endpoint string, t task) ([]byte, error) {
	now := d.o.Now()
	msg := fmt.Sprintf("not queued: this endpoint's backlog of deliveries it has not accepted has reached %s, "+
		"the most it may hold; this event is dropped for it (events are queued again as it accepts the backlog)",
		sizeText(d.o.MaxQueuedBytes))
	dl := Delivery{
		ID: session.NewID(DeliveryPrefix, now), Object: DeliveryObject, EndpointID: endpoint,
		EventID: t.EventID, EventType: t.Type, Attempt: 1, Status: StatusGaveUp, Error: &msg,
		CreatedAt: *session.At(now),
	}
	if t.SessionID != "" {
		dl.SessionID = &t.SessionID
	}
	b, err := json.Marshal(dl)
	if err != nil {
		return nil, fmt.Errorf("encode delivery: %w", err)
	}
	return b, nil
}

// sizeText writes n bytes for a person: in MiB or KiB when whole.
func sizeText(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// plan returns the queues that one outbox entry goes to and the task queued on each, with
// its encoding; none for an entry that is not delivered (an internal or unreadable one, or
// no subscriber).
func (d *Dispatcher) plan(m redis.XMessage, eps []Endpoint, log *slog.Logger) (names []string, t task, enc string) {
	if m.Values == nil { // deleted from the stream while pending
		return nil, task{}, ""
	}
	ev, err := store.DecodeEvent(m.ID, m.Values)
	if err != nil {
		log.Error("skip unreadable outbox entry", "entry", m.ID, "err", err)
		return nil, task{}, ""
	}
	if !slices.Contains(d.public, ev.Type) {
		return nil, task{}, ""
	}
	for _, e := range eps {
		if e.Subscribed(ev.Type) {
			names = append(names, queueName(e.ID, ev.SessionID))
		}
	}
	if len(names) == 0 {
		return nil, task{}, ""
	}
	body, err := BuildPayload(ev)
	if err == nil {
		t = task{EventID: ev.ID, Type: ev.Type, SessionID: ev.SessionID, Body: body}
		var b []byte
		b, err = json.Marshal(t)
		enc = string(b)
	}
	if err != nil {
		log.Error("skip outbox entry", "entry", m.ID, "event", ev.ID, "err", err)
		return nil, task{}, ""
	}
	return names, t, enc
}

// share is how many deliveries project may have in flight: an equal part of Concurrency
// among the projects with work, itself included, and one more, so that a project whose
// work just arrived finds a part free at once instead of waiting for others' slow
// endpoints to time out; at least one.
func (d *Dispatcher) share(project string) int {
	d.fair.Lock()
	defer d.fair.Unlock()
	n := len(d.wanting)
	if !d.wanting[project] {
		n++
	}
	return max(1, cap(d.sem)/(n+1))
}

// want records whether project has deliveries in flight or due.
func (d *Dispatcher) want(project string, wants bool) {
	d.fair.Lock()
	defer d.fair.Unlock()
	if wants {
		d.wanting[project] = true
	} else {
		delete(d.wanting, project)
	}
}

// inFlight answers how many deliveries of project are in flight here.
func (d *Dispatcher) inFlight(project string) int {
	d.fair.Lock()
	defer d.fair.Unlock()
	return d.busy[project]
}

// dispatch leases the project's due queues, up to its fair share of the free slots, starts
// attempting their heads, and brings the project's entry in the global due set up to date;
// false if Redis failed it.
//
// held: another dispatcher holds the project's outbox, and consume lowered the project's
// entry to when that hold lapses; a resync now could raise it past that, so none is made:
// the entry comes due then, or earlier.
func (d *Dispatcher) dispatch(ctx context.Context, p string, picked, held bool, log *slog.Logger) bool {
	if ctx.Err() != nil {
		return false
	}
	k := projectKeys(p)
	inflight := d.inFlight(p)
	free := max(0, min(cap(d.sem)-len(d.sem), d.share(p)-inflight))
	now := d.nowMs()
	lease := now + (d.o.Timeout + leaseMargin).Milliseconds()
	// Detached, so that a lease taken just as ctx ends is known, and handed back.
	wctx, cancel := detached(ctx)
	res, err := claimScript.Run(wctx, d.rdb, []string{k.due()}, now, lease, free).Slice()
	cancel()
	if err != nil || len(res) != 2 {
		log.Warn("claim due deliveries", "err", err)
		return false
	}
	names := strs(res[0])
	left, _ := res[1].(int64)
	d.want(p, inflight+len(names) > 0 || left > 0)
	for i, name := range names {
		select {
		case d.sem <- struct{}{}:
		case <-ctx.Done():
			for _, n := range names[i:] {
				d.release(ctx, p, n, lease, log)
			}
			d.resync(ctx, p, log)
			return false
		}
		d.fair.Lock()
		d.busy[p]++
		d.fair.Unlock()
		d.inflight.Go(func() {
			defer d.finished(ctx, p, log)
			d.deliver(ctx, p, name, lease, log)
		})
	}
	if left > 0 && inflight+len(names) > 0 {
		// Queues wait for the project's share, which its own deliveries in flight free as
		// they finish, each bringing its entry up to date (finished). Until then the entry
		// need only come due should this dispatcher die: when the leases end.
		err := d.rdb.ZAddLT(ctx, store.WebhooksDueKey, redis.Z{Score: float64(lease), Member: p}).Err()
		if err != nil && ctx.Err() == nil {
			log.Warn("schedule waiting deliveries", "err", err)
			return false
		}
		return true
	}
	if held || !picked && len(names) == 0 && left == 0 {
		// Nothing was due and nothing changed: the project's entry, if any, is still right.
		return true
	}
	return d.resync(ctx, p, log)
}

// finished ends a delivery: it frees its slot and brings the project's entry in the global
// due set up to date (the queue's next head may be due now, or its retry later).
func (d *Dispatcher) finished(ctx context.Context, p string, log *slog.Logger) {
	<-d.sem
	d.fair.Lock()
	if d.busy[p]--; d.busy[p] <= 0 {
		delete(d.busy, p)
		delete(d.wanting, p)
	}
	d.fair.Unlock()
	d.resync(ctx, p, log)
	d.poke()
}

// resync sets the project's entry in the global due set to the earliest score of its due
// queues, or removes it when it has none.
//
// Every change to a project's due queues is followed by a resync or by a ZADD LT of the new
// score: lowering the entry is always safe (at worst the project is handled once for
// nothing), but raising it could hide a queue that another dispatcher just made due, and
// the two keys live in different Cluster slots, so no script can do both. So resync raises
// it to the earliest score it read, then reads again and lowers it to what that read found:
// a change made after the first read is either in the second read or followed by its own
// ZADD LT after the raise.
func (d *Dispatcher) resync(ctx context.Context, p string, log *slog.Logger) bool {
	wctx, cancel := detached(ctx)
	defer cancel()
	due := projectKeys(p).due()
	first := func() (float64, bool, error) {
		z, err := d.rdb.ZRangeWithScores(wctx, due, 0, 0).Result()
		if err != nil || len(z) == 0 {
			return 0, false, err
		}
		return z[0].Score, true, nil
	}
	at, ok, err := first()
	if err == nil {
		if ok {
			err = d.rdb.ZAdd(wctx, store.WebhooksDueKey, redis.Z{Score: at, Member: p}).Err()
		} else {
			err = d.rdb.ZRem(wctx, store.WebhooksDueKey, p).Err()
		}
	}
	var again float64
	var okAgain bool
	if err == nil {
		again, okAgain, err = first()
	}
	if err == nil && okAgain && (!ok || again < at) {
		err = d.rdb.ZAddLT(wctx, store.WebhooksDueKey, redis.Z{Score: again, Member: p}).Err()
	}
	if err != nil {
		log.Warn("schedule due deliveries", "err", err)
		return false
	}
	return true
}

func (d *Dispatcher) release(ctx context.Context, p, name string, lease int64, log *slog.Logger) {
	wctx, cancel := detached(ctx)
	defer cancel()
	if err := releaseScript.Run(wctx, d.rdb, []string{projectKeys(p).due()}, name, lease, d.nowMs()).Err(); err != nil {
		log.Warn("hand back delivery", "queue", name, "err", err)
	}
}

func (d *Dispatcher) drop(ctx context.Context, p, name string, lease int64, all bool, log *slog.Logger) {
	k := projectKeys(p)
	wctx, cancel := detached(ctx)
	defer cancel()
	a := "0"
	if all {
		a = "1"
	}
	err := dropScript.Run(wctx, d.rdb, []string{k.due(), k.queue(name), k.meta(name), k.queued()},
		name, lease, a, d.nowMs(), queueEndpoint(name)).Err()
	if err != nil {
		log.Warn("drop delivery queue", "queue", name, "err", err)
	}
}

// deliver attempts the head of one leased queue and records the outcome.
func (d *Dispatcher) deliver(ctx context.Context, p, name string, lease int64, log *slog.Logger) {
	k := projectKeys(p)
	epID := queueEndpoint(name)
	var head *redis.StringCmd
	var meta *redis.SliceCmd
	var epCmd *redis.StringCmd
	_, err := d.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		head = p.LIndex(ctx, k.queue(name), 0)
		meta = p.HMGet(ctx, k.meta(name), "attempt", "first")
		epCmd = p.HGet(ctx, k.endpoints(), epID)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		if ctx.Err() == nil {
			log.Warn("read delivery queue", "queue", name, "err", err)
		}
		d.release(ctx, p, name, lease, log)
		return
	}
	if errors.Is(epCmd.Err(), redis.Nil) {
		d.drop(ctx, p, name, lease, true, log) // the endpoint was deleted
		return
	}
	if errors.Is(head.Err(), redis.Nil) {
		d.drop(ctx, p, name, lease, false, log)
		return
	}
	ep, err := decodeEndpoint([]byte(epCmd.Val()))
	if err != nil {
		log.Error("undecodable endpoint", "endpoint", epID, "err", err)
		d.release(ctx, p, name, lease, log)
		return
	}
	start := d.o.Now()
	attempt, first := 1, start.UnixMilli()
	if v := meta.Val(); len(v) == 2 {
		if s, ok := v[0].(string); ok {
			n, _ := strconv.Atoi(s)
			attempt = n + 1
		}
		if s, ok := v[1].(string); ok {
			if ms, err := strconv.ParseInt(s, 10, 64); err == nil && ms > 0 {
				first = ms
			}
		}
	}
	r := result{}
	t, err := decodeTask([]byte(head.Val()))
	if err != nil {
		r.err, r.permanent = "undecodable queued delivery: "+err.Error(), true
	} else {
		r = d.post(ctx, ep, t, start)
	}
	if !r.ok() && ctx.Err() != nil {
		d.release(ctx, p, name, lease, log) // cut short by shutdown: not an attempt
		return
	}
	now := d.o.Now()
	dl := Delivery{
		ID: session.NewID(DeliveryPrefix, start), Object: DeliveryObject, EndpointID: ep.ID,
		EventID: t.EventID, EventType: t.Type, Attempt: attempt, ResponseStatus: r.status,
		DurationMs: r.dur.Milliseconds(), CreatedAt: *session.At(start),
	}
	if t.SessionID != "" {
		dl.SessionID = &t.SessionID
	}
	mode, score := "pop", now.UnixMilli()
	switch {
	case r.ok():
		dl.Status, mode = StatusSucceeded, "done"
	case r.permanent:
		dl.Status = StatusFailed
	case start.UnixMilli()-first >= d.o.RetryWindow.Milliseconds():
		dl.Status = StatusGaveUp
	default:
		dl.Status, mode = StatusRetrying, "retry"
		next := now.Add(max(d.o.Backoff(attempt), 0))
		dl.NextAttemptAt = session.At(next)
		score = next.UnixMilli()
	}
	if !r.ok() {
		msg := r.err
		dl.Error = &msg
	}
	b, err := json.Marshal(dl)
	if err != nil {
		log.Error("encode delivery", "err", err)
		return
	}
	wctx, cancel := detached(ctx)
	defer cancel()
	res, err := completeScript.Run(wctx, d.rdb,
		[]string{k.due(), k.queue(name), k.meta(name), k.endpoints(), k.log(ep.ID), k.queued()},
		name, lease, mode, score, attempt, first, ep.ID, b, MaxLogEntries).Int()
	switch {
	case err != nil:
		log.Warn("record delivery", "queue", name, "event", t.EventID, "err", err)
	case res == -1:
		log.Warn("delivery lease lost; another dispatcher repeats it", "queue", name, "event", t.EventID)
	}
	if dl.Status != StatusSucceeded {
		log.Info("webhook delivery failed", "endpoint", ep.ID, "event", t.EventID,
			"attempt", attempt, "status", dl.Status, "response_status", r.status, "err", r.err)
	}
}

type result struct {
	status    int
	err       string
	permanent bool // retrying cannot help
	dur       time.Duration
}

func (r result) ok() bool { return r.status >= 200 && r.status < 300 && r.err == "" }

// post makes one signed attempt, stamped at.
func (d *Dispatcher) post(ctx context.Context, ep Endpoint, t task, at time.Time) result {
	key, err := SecretKey(ep.Secret)
	if err != nil {
		return result{err: err.Error(), permanent: true}
	}
	actx, cancel := context.WithTimeout(ctx, d.o.Timeout)
	defer cancel()
	body := []byte(t.Body)
	req, err := http.NewRequestWithContext(actx, http.MethodPost, ep.URL, bytes.NewReader(body))
	if err != nil {
		return result{err: truncate(err.Error()), permanent: true}
	}
	ts := at.Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "wb-webhooks/1")
	req.Header.Set(HeaderID, t.EventID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, Sign(key, t.EventID, ts, body))
	start := time.Now()
	resp, err := d.o.HTTPClient.Do(req)
	if err != nil {
		return result{err: truncate(err.Error()), dur: time.Since(start)}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBodyRead))
	_ = resp.Body.Close()
	r := result{status: resp.StatusCode, dur: time.Since(start)}
	if !r.ok() {
		r.err = fmt.Sprintf("endpoint answered HTTP %d", resp.StatusCode)
	}
	return r
}

func truncate(s string) string {
	if len(s) > maxErrLen {
		return s[:maxErrLen]
	}
	return s
}
