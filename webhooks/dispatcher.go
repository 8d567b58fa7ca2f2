package webhooks

import (
	"bytes"
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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
	"wb/store"
)

// Group is the consumer group the dispatcher reads each project's outbox with.
const Group = "webhooks"

const (
	readCount     = 100             // outbox entries per XREADGROUP
	readRounds    = 10              // XREADGROUP calls per poll at most
	redisTimeout  = 5 * time.Second // for the writes that must finish even when stopping
	leaseMargin   = 30 * time.Second
	maxBodyRead   = 64 << 10
	maxErrLen     = 500
	staleConsumer = time.Hour // a consumer idle this long with nothing pending is removed
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
	// Consumer names this dispatcher in the consumer group (default host-pid).
	Consumer string
	// Backoff is the wait after the attempt-th failed attempt of a delivery
	// (default DefaultBackoff).
	Backoff func(attempt int) time.Duration
	// RetryWindow: a delivery is given up when an attempt made at least this long after its
	// first attempt fails (default 24 h), so it is retried for at least that long.
	RetryWindow time.Duration
	// PollInterval is how often each project's outbox and due retries are polled
	// (default 250 ms).
	PollInterval time.Duration
	// ProjectsInterval is how often new projects are looked for (default 1 s).
	ProjectsInterval time.Duration
	// ClaimIdle is how long a project's outbox stays held by a dispatcher that stopped
	// renewing its hold, and the minimum idle time of the XAUTOCLAIM sweep (default 30 s).
	ClaimIdle time.Duration
	// Concurrency bounds the deliveries in flight (default 32). The N projects that have work
	// may each hold Concurrency/(N+1) of it (a lone project half), so one project's slow
	// endpoints never hold every slot and another's deliveries start at once.
	Concurrency int
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Now replaces time.Now for timestamps and schedules.
	Now func() time.Time
}

// DefaultBackoff waits 5 s after the first failure and doubles each time up to 1 h per wait,
// less a random jitter of up to 20 %. With the default 24 h RetryWindow that makes about 35
// attempts.
func DefaultBackoff(attempt int) time.Duration {
	d := 5 * time.Second
	for i := 1; i < attempt && d < time.Hour; i++ {
		d *= 2
	}
	d = min(d, time.Hour)
	return d - rand.N(d/5+1)
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
	if o.PollInterval <= 0 {
		o.PollInterval = 250 * time.Millisecond
	}
	if o.ProjectsInterval <= 0 {
		o.ProjectsInterval = time.Second
	}
	if o.ClaimIdle <= 0 {
		o.ClaimIdle = 30 * time.Second
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 32
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
// Each project's outbox is consumed by one dispatcher at a time (a hold with a TTL, fencing
// every ack), through the consumer group Group. For each entry it appends one task per
// subscribed endpoint to the queue of (endpoint, session) and acks the entry in the same
// Lua script, so an entry is acked exactly when its deliveries are durably queued. Any
// dispatcher then leases due queues and attempts their heads; a queue's next task is
// attempted only after its head succeeded or was given up, which keeps each session's
// events in order per endpoint without blocking other sessions or endpoints.
type Dispatcher struct {
	rdb    redis.UniversalClient
	reg    *Registry
	o      Options
	holder string // the value of a project's owner key while this dispatcher holds it
	log    *slog.Logger
	sem    chan struct{}
	public []string

	fair    sync.Mutex
	wanting map[string]bool // projects with deliveries in flight or due
}

// NewDispatcher returns a dispatcher; Run starts it.
func NewDispatcher(rdb redis.UniversalClient, reg *Registry, opts Options) *Dispatcher {
	o := opts.withDefaults(reg)
	return &Dispatcher{
		rdb: rdb, reg: reg, o: o,
		holder:  o.Consumer + "/" + session.NewID("", time.Now()),
		log:     o.Logger.With("component", "webhooks", "consumer", o.Consumer),
		sem:     make(chan struct{}, o.Concurrency),
		public:  session.PublicEvents(),
		wanting: map[string]bool{},
	}
}

// Run delivers until ctx is cancelled, then waits for the attempts in flight (an attempt cut
// short is handed back, to be made again) and returns nil.
func (d *Dispatcher) Run(ctx context.Context) error {
	if d.rdb == nil || d.reg == nil {
		return errors.New("webhooks: dispatcher needs a Redis client and a registry")
	}
	var wg sync.WaitGroup
	defer d.o.HTTPClient.CloseIdleConnections()
	defer wg.Wait()
	started := map[string]bool{}
	tick := time.NewTicker(d.o.ProjectsInterval)
	defer tick.Stop()
	for {
		ids, err := d.rdb.SMembers(ctx, store.ProjectsKey).Result()
		if err != nil && ctx.Err() == nil {
			d.log.Warn("list projects", "err", err)
		}
		for _, p := range ids {
			if started[p] || ctx.Err() != nil {
				continue
			}
			started[p] = true
			l := &projectLoop{d: d, project: p, k: projectKeys(p), wake: make(chan struct{}, 1),
				log: d.log.With("project", p)}
			wg.Go(func() { l.run(ctx) })
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (d *Dispatcher) nowMs() int64 { return d.o.Now().UnixMilli() }

// projectLoop consumes one project's outbox and attempts its due deliveries.
type projectLoop struct {
	d       *Dispatcher
	project string
	k       keys
	log     *slog.Logger
	wake    chan struct{}

	// Owned by run's goroutine.
	groupReady   bool
	holding      bool
	renewAt      time.Time
	checkPending bool // read our own pending entries before new ones
	swept        time.Time

	inflight sync.WaitGroup
	busy     atomic.Int32 // deliveries in flight
}

func (l *projectLoop) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *projectLoop) run(ctx context.Context) {
	defer l.inflight.Wait()
	defer l.letGo()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		l.consume(ctx)
		l.dispatch(ctx)
		timer.Reset(l.d.o.PollInterval)
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-timer.C:
		}
	}
}

// detached is a context for the writes that must finish even when ctx is cancelled.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), redisTimeout)
}

func (l *projectLoop) letGo() {
	if !l.holding {
		return
	}
	ctx, cancel := detached(context.Background())
	defer cancel()
	if err := letGoScript.Run(ctx, l.d.rdb, []string{l.k.owner()}, l.d.holder).Err(); err != nil {
		l.log.Warn("let go of outbox", "err", err)
	}
	l.holding = false
}

// consume moves new outbox entries into delivery queues while this dispatcher holds the
// project's outbox.
func (l *projectLoop) consume(ctx context.Context) {
	d, stream := l.d, store.Outbox(l.project)
	if !l.groupReady {
		err := d.rdb.XGroupCreateMkStream(ctx, stream, Group, "0").Err()
		if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			if ctx.Err() == nil {
				l.log.Warn("create consumer group", "err", err)
			}
			return
		}
		l.groupReady = true
	}
	now := d.o.Now()
	if !l.holding || !now.Before(l.renewAt) {
		res, err := holdScript.Run(ctx, d.rdb, []string{l.k.owner()}, d.holder, d.o.ClaimIdle.Milliseconds()).Int()
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("hold outbox", "err", err)
			}
			return
		}
		if res == 0 {
			l.holding = false
			return
		}
		if res == 1 || !l.holding {
			// Newly held: whoever held it before is fenced off, so take over everything
			// it left pending and deliver that first, in stream order.
			if _, err := l.claim(ctx, 0); err != nil {
				return
			}
			l.checkPending = true
			l.swept = now
		}
		l.holding = true
		l.renewAt = now.Add(d.o.ClaimIdle / 3)
	}
	if now.Sub(l.swept) >= d.o.ClaimIdle/2 {
		n, err := l.claim(ctx, d.o.ClaimIdle)
		if err != nil {
			return
		}
		if n > 0 {
			l.checkPending = true
		}
		l.swept = now
		l.removeStaleConsumers(ctx)
	}
	for range readRounds {
		id := ">"
		if l.checkPending {
			id = "0"
		}
		msgs, err := l.read(ctx, id)
		if err != nil {
			if strings.Contains(err.Error(), "NOGROUP") {
				l.groupReady = false
			}
			if ctx.Err() == nil && !errors.Is(err, errNotHeld) {
				l.log.Warn("read outbox", "err", err)
			}
			return
		}
		if len(msgs) == 0 {
			if l.checkPending {
				l.checkPending = false
				continue
			}
			return
		}
		if !l.process(ctx, msgs) {
			l.checkPending = true
			return
		}
		if !l.checkPending && len(msgs) < readCount {
			return
		}
	}
}

// errNotHeld: another dispatcher holds the project's outbox now.
var errNotHeld = errors.New("outbox held by another dispatcher")

// claim moves to this consumer the entries pending for at least minIdle on others.
func (l *projectLoop) claim(ctx context.Context, minIdle time.Duration) (int, error) {
	n, start := 0, "0-0"
	for range 1000 {
		res, err := autoclaimScript.Run(ctx, l.d.rdb, []string{l.k.owner(), store.Outbox(l.project)},
			l.d.holder, Group, l.d.o.Consumer, minIdle.Milliseconds(), start, readCount).Result()
		if err == nil {
			if v, ok := res.(int64); ok && v == -1 {
				l.holding = false
				return n, errNotHeld
			}
		}
		var next string
		var ids []any
		if err == nil {
			next, ids, err = parseAutoclaim(res)
		}
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("claim pending outbox entries", "err", err)
			}
			return n, fmt.Errorf("xautoclaim: %w", err)
		}
		n += len(ids)
		if next == "0-0" || next == "" {
			break
		}
		start = next
	}
	return n, nil
}

func parseAutoclaim(res any) (string, []any, error) {
	r, ok := res.([]any)
	if !ok || len(r) < 2 {
		return "", nil, fmt.Errorf("unexpected XAUTOCLAIM reply %T", res)
	}
	next, _ := r[0].(string)
	ids, _ := r[1].([]any)
	return next, ids, nil
}

// read reads up to readCount entries for this consumer: its own pending ones from id "0",
// new ones from ">". It reads nothing unless this dispatcher holds the outbox.
func (l *projectLoop) read(ctx context.Context, id string) ([]redis.XMessage, error) {
	res, err := readScript.Run(ctx, l.d.rdb, []string{l.k.owner(), store.Outbox(l.project)},
		l.d.holder, Group, l.d.o.Consumer, readCount, id).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if v, ok := res.(int64); ok && v == -1 {
		l.holding = false
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

// removeStaleConsumers drops consumers of earlier runs that have nothing pending.
func (l *projectLoop) removeStaleConsumers(ctx context.Context) {
	stream := store.Outbox(l.project)
	cs, err := l.d.rdb.XInfoConsumers(ctx, stream, Group).Result()
	if err != nil {
		return
	}
	for _, c := range cs {
		if c.Name != l.d.o.Consumer && c.Pending == 0 && c.Idle >= staleConsumer {
			_ = l.d.rdb.XGroupDelConsumer(ctx, stream, Group, c.Name).Err()
		}
	}
}

// task is one queued delivery.
type task struct {
	EventID   string `json:"event_id"`
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
	Body      string `json:"body"`
}

// process queues the deliveries of msgs in order; false when it stopped at an entry that
// must be read again.
func (l *projectLoop) process(ctx context.Context, msgs []redis.XMessage) bool {
	d, stream := l.d, store.Outbox(l.project)
	eps, err := d.reg.list(ctx, l.project)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("list endpoints", "err", err)
		}
		return false
	}
	for _, m := range msgs {
		if ctx.Err() != nil {
			return false
		}
		names, enc := l.plan(m, eps)
		wctx, cancel := detached(ctx)
		if len(names) == 0 {
			err = d.rdb.XAck(wctx, stream, Group, m.ID).Err()
		} else {
			ks := []string{l.k.owner(), stream, l.k.due()}
			args := []any{d.holder, Group, m.ID, d.nowMs()}
			for _, n := range names {
				ks = append(ks, l.k.queue(n))
				args = append(args, n, enc)
			}
			var res int
			res, err = enqueueScript.Run(wctx, d.rdb, ks, args...).Int()
			if err == nil && res == -1 {
				l.holding = false
				cancel()
				return false
			}
		}
		cancel()
		if err != nil {
			l.log.Warn("queue outbox entry", "entry", m.ID, "err", err)
			return false
		}
	}
	return true
}

// plan returns the queues that one outbox entry goes to and the task queued on each; none
// for an entry that is not delivered (an internal or unreadable one, or no subscriber).
func (l *projectLoop) plan(m redis.XMessage, eps []Endpoint) (names []string, enc string) {
	if m.Values == nil { // deleted from the stream while pending
		return nil, ""
	}
	ev, err := store.DecodeEvent(m.ID, m.Values)
	if err != nil {
		l.log.Error("skip unreadable outbox entry", "entry", m.ID, "err", err)
		return nil, ""
	}
	if !slices.Contains(l.d.public, ev.Type) {
		return nil, ""
	}
	for _, e := range eps {
		if e.Subscribed(ev.Type) {
			names = append(names, queueName(e.ID, ev.SessionID))
		}
	}
	if len(names) == 0 {
		return nil, ""
	}
	body, err := BuildPayload(ev)
	if err == nil {
		var b []byte
		b, err = json.Marshal(task{EventID: ev.ID, Type: ev.Type, SessionID: ev.SessionID, Body: string(body)})
		enc = string(b)
	}
	if err != nil {
		l.log.Error("skip outbox entry", "entry", m.ID, "event", ev.ID, "err", err)
		return nil, ""
	}
	return names, enc
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

// dispatch leases the project's due queues, up to its fair share of the free slots, and
// attempts their heads.
func (l *projectLoop) dispatch(ctx context.Context) {
	d := l.d
	if ctx.Err() != nil {
		return
	}
	inflight := int(l.busy.Load())
	free := min(cap(d.sem)-len(d.sem), d.share(l.project)-inflight)
	now := d.nowMs()
	if free <= 0 {
		wants := inflight > 0
		if !wants {
			// Waiting for a slot is work only if something is due.
			n, err := d.rdb.ZCount(ctx, l.k.due(), "-inf", strconv.FormatInt(now, 10)).Result()
			wants = err != nil || n > 0
		}
		d.want(l.project, wants)
		return
	}
	lease := now + (d.o.Timeout + leaseMargin).Milliseconds()
	// Detached, so that a lease taken just as ctx ends is known, and handed back.
	wctx, cancel := detached(ctx)
	names, err := claimScript.Run(wctx, d.rdb, []string{l.k.due()}, now, lease, free).StringSlice()
	cancel()
	if err != nil {
		l.log.Warn("claim due deliveries", "err", err)
		return
	}
	d.want(l.project, len(names) > 0 || inflight > 0)
	for i, name := range names {
		select {
		case d.sem <- struct{}{}:
		case <-ctx.Done():
			for _, n := range names[i:] {
				l.release(ctx, n, lease)
			}
			return
		}
		l.busy.Add(1)
		l.inflight.Go(func() {
			defer func() { <-d.sem; l.busy.Add(-1) }()
			l.deliver(ctx, name, lease)
		})
	}
}

func (l *projectLoop) release(ctx context.Context, name string, lease int64) {
	wctx, cancel := detached(ctx)
	defer cancel()
	if err := releaseScript.Run(wctx, l.d.rdb, []string{l.k.due()}, name, lease, l.d.nowMs()).Err(); err != nil {
		l.log.Warn("hand back delivery", "queue", name, "err", err)
	}
}

func (l *projectLoop) drop(ctx context.Context, name string, lease int64, all bool) {
	wctx, cancel := detached(ctx)
	defer cancel()
	a := "0"
	if all {
		a = "1"
	}
	err := dropScript.Run(wctx, l.d.rdb, []string{l.k.due(), l.k.queue(name), l.k.meta(name)}, name, lease, a, l.d.nowMs()).Err()
	if err != nil {
		l.log.Warn("drop delivery queue", "queue", name, "err", err)
	}
}

// deliver attempts the head of one leased queue and records the outcome.
func (l *projectLoop) deliver(ctx context.Context, name string, lease int64) {
	d := l.d
	epID := queueEndpoint(name)
	var head *redis.StringCmd
	var meta *redis.SliceCmd
	var epCmd *redis.StringCmd
	_, err := d.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		head = p.LIndex(ctx, l.k.queue(name), 0)
		meta = p.HMGet(ctx, l.k.meta(name), "attempt", "first")
		epCmd = p.HGet(ctx, l.k.endpoints(), epID)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		if ctx.Err() == nil {
			l.log.Warn("read delivery queue", "queue", name, "err", err)
		}
		l.release(ctx, name, lease)
		return
	}
	if errors.Is(epCmd.Err(), redis.Nil) {
		l.drop(ctx, name, lease, true) // the endpoint was deleted
		return
	}
	if errors.Is(head.Err(), redis.Nil) {
		l.drop(ctx, name, lease, false)
		return
	}
	ep, err := decodeEndpoint([]byte(epCmd.Val()))
	if err != nil {
		l.log.Error("undecodable endpoint", "endpoint", epID, "err", err)
		l.release(ctx, name, lease)
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
	var t task
	r := result{}
	if err := json.Unmarshal([]byte(head.Val()), &t); err != nil {
		r.err, r.permanent = "undecodable queued delivery: "+err.Error(), true
	} else {
		r = l.post(ctx, ep, t, start)
	}
	if !r.ok() && ctx.Err() != nil {
		l.release(ctx, name, lease) // cut short by shutdown: not an attempt
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
		dl.Status = StatusSucceeded
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
		l.log.Error("encode delivery", "err", err)
		return
	}
	wctx, cancel := detached(ctx)
	defer cancel()
	res, err := completeScript.Run(wctx, d.rdb,
		[]string{l.k.due(), l.k.queue(name), l.k.meta(name), l.k.endpoints(), l.k.log(ep.ID)},
		name, lease, mode, score, attempt, first, ep.ID, b, MaxLogEntries).Int()
	switch {
	case err != nil:
		l.log.Warn("record delivery", "queue", name, "event", t.EventID, "err", err)
	case res == 2:
		l.poke()
	case res == -1:
		l.log.Warn("delivery lease lost; another dispatcher repeats it", "queue", name, "event", t.EventID)
	}
	if dl.Status != StatusSucceeded {
		l.log.Info("webhook delivery failed", "endpoint", ep.ID, "event", t.EventID,
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
func (l *projectLoop) post(ctx context.Context, ep Endpoint, t task, at time.Time) result {
	key, err := SecretKey(ep.Secret)
	if err != nil {
		return result{err: err.Error(), permanent: true}
	}
	actx, cancel := context.WithTimeout(ctx, l.d.o.Timeout)
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
	resp, err := l.d.o.HTTPClient.Do(req)
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
