package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/store"
)

// settleScript applies a run of one session's consecutive usage records (seqs min..max, all
// in one hour) once: a run wholly at or below the session's last settled seq is a replay and
// changes nothing; a run that straddles it answers -1 and the caller settles its records one
// by one. It adds the run's sums to the project's and end user's spend counters (hour, day,
// month) and to the hourly report bucket, and answers {applied, project month total, end-user
// month total} in nano-USD. (The session's own usage to date is the store's: AddSessionUsage.)
// A desktop's session is labelled in the bucket with its desktop (the session hash's desk),
// so the report names the desktop after the session itself has expired.
//
// The seq hash's entries and the spend hash's hourly, daily and monthly fields are indexed
// by time (the seq index, the hours, days and months indexes) so that pruneScript drops them
// when nothing needs them any more.
//
// KEYS: seq hash, spend hash, hour bucket, session hash, seq index, hours index, days index,
// months index
// ARGV: session, min seq, end user, session_ms, paused_ms, cpu_ms, mem_gib_ms, egress,
// cost nano, hour, day, month, max seq, now ms, hour's start ms, day's start ms, month's end ms
var settleScript = redis.NewScript(`
local sid, eu = ARGV[1], ARGV[3]
local last = tonumber(redis.call('HGET', KEYS[1], sid) or '0')
if tonumber(ARGV[13]) <= last then return {0, 0, 0} end
if tonumber(ARGV[2]) <= last then return {-1, 0, 0} end
redis.call('HSET', KEYS[1], sid, ARGV[13])
redis.call('ZADD', KEYS[5], ARGV[14], sid)
local names = {'session_ms', 'paused_ms', 'cpu_ms', 'mem_gib_ms', 'egress_bytes', 'cost_nano'}
local vals = {ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]}
local cost = ARGV[9]
local m = redis.call('HINCRBY', KEYS[2], 'm:' .. ARGV[12], cost)
redis.call('HINCRBY', KEYS[2], 'd:' .. ARGV[11], cost)
redis.call('HINCRBY', KEYS[2], 'h:' .. ARGV[10], cost)
redis.call('ZADD', KEYS[6], ARGV[15], 'h:' .. ARGV[10])
redis.call('ZADD', KEYS[7], ARGV[16], 'd:' .. ARGV[11])
redis.call('ZADD', KEYS[8], ARGV[17], 'm:' .. ARGV[12])
local em = 0
if eu ~= '' then
  em = redis.call('HINCRBY', KEYS[2], 'eu:' .. eu .. ':m:' .. ARGV[12], cost)
  redis.call('HINCRBY', KEYS[2], 'eu:' .. eu .. ':d:' .. ARGV[11], cost)
  redis.call('HINCRBY', KEYS[2], 'eu:' .. eu .. ':h:' .. ARGV[10], cost)
  redis.call('ZADD', KEYS[6], ARGV[15], 'eu:' .. eu .. ':h:' .. ARGV[10])
  redis.call('ZADD', KEYS[7], ARGV[16], 'eu:' .. eu .. ':d:' .. ARGV[11])
  redis.call('ZADD', KEYS[8], ARGV[17], 'eu:' .. eu .. ':m:' .. ARGV[12])
end
for i = 1, 6 do
  redis.call('HINCRBY', KEYS[3], 's:' .. sid .. ':' .. names[i], vals[i])
  redis.call('HINCRBY', KEYS[3], 'e:' .. eu .. ':' .. names[i], vals[i])
  redis.call('HINCRBY', KEYS[3], 't:' .. names[i], vals[i])
end
local desk = redis.call('HGET', KEYS[4], 'desk')
if desk then redis.call('HSET', KEYS[3], 'sd:' .. sid, desk) end
redis.call('EXPIRE', KEYS[3], 34560000)
return {1, m, em}
`)

// ackScript acknowledges settled records and trims the usage stream of what every group has
// acknowledged, so that it holds only records not yet settled rather than every record ever
// (one every few seconds per running session). A record read and not acknowledged stays for
// another settler to claim.
//
// KEYS: usage stream. ARGV: group, record ids.
var ackScript = redis.NewScript(store.StreamTrimLua + `
for i = 2, #ARGV do redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) end
trim(KEYS[1])
return 0
`)

func monthOf(t time.Time) string { return t.UTC().Format("200601") }

// dayStart is the start of t's day, UTC (the day of a daily spend field).
func dayStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// monthEnd answers the end of t's month (UTC): the start of the next.
func monthEnd(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, time.UTC)
}

// settlerGroup is the consumer group of settlers on every usage stream, and on the usage
// signals.
const settlerGroup = "settler"

// maxWait bounds one blocking read of usage signals, so that signals a dead settler left
// are claimed (store.Signals) even when nothing else happens.
const maxWait = 10 * time.Second

// retryAfter is how long the settler waits after Redis failed it.
const retryAfter = time.Second

// stopRetryEvery is how often the settler carries on the unfinished stops of crossed caps:
// at each wake, at most every maxWait, so that an idle settler wakes no more often for it.
const stopRetryEvery = maxWait

// Settler consumes usage records and settles them exactly once.
type Settler struct {
	rdb            redis.UniversalClient
	store          *store.Store
	prices         Prices
	caps           *Caps     // nil: no spend caps
	enforcer       *Enforcer // nil: no stops to carry on
	consumer       string
	log            *slog.Logger
	batch          int64
	accrueEvery    time.Duration
	fullSweepEvery time.Duration
	replayWindow   time.Duration
	now            func() time.Time
}

// SettlerOptions configure a Settler.
type SettlerOptions struct {
	Prices Prices
	Caps   *Caps
	// Enforcer, when set, is asked every stopRetryEvery to carry on the stops of crossed caps
	// that left sessions live (Enforcer.RetryStops).
	Enforcer *Enforcer
	// Consumer names this settler in the settlers' consumer groups: unique per settler, and
	// the same across its restarts. Default host-pid.
	Consumer string
	Batch    int // records per read, default 512
	// AccrueEvery is how often snapshot storage is billed (default 1 min).
	AccrueEvery time.Duration
	// FullSweepEvery: how often, besides at start, the settler looks at every project's
	// usage stream, for records whose signal was lost. Default 5 min.
	FullSweepEvery time.Duration
	// ReplayWindow is how long after a session's last settled record a replay of its
	// records is still recognised, and not billed again; the full sweep forgets the sessions
	// settled longer ago. Default DefaultReplayWindow.
	ReplayWindow time.Duration
	Logger       *slog.Logger
}

// NewSettler returns a settler.
func NewSettler(rdb redis.UniversalClient, o SettlerOptions) *Settler {
	if o.Consumer == "" {
		h, _ := os.Hostname()
		o.Consumer = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if o.Batch == 0 {
		o.Batch = 512
	}
	if o.AccrueEvery == 0 {
		o.AccrueEvery = time.Minute
	}
	if o.FullSweepEvery == 0 {
		o.FullSweepEvery = 5 * time.Minute
	}
	if o.ReplayWindow == 0 {
		o.ReplayWindow = DefaultReplayWindow
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Prices.SessionPerSecond == nil {
		o.Prices = DefaultPrices()
	}
	return &Settler{rdb: rdb, store: store.New(rdb), prices: o.Prices, caps: o.Caps, enforcer: o.Enforcer, consumer: o.Consumer, log: o.Logger,
		batch: int64(o.Batch), accrueEvery: o.AccrueEvery, fullSweepEvery: o.FullSweepEvery, replayWindow: o.ReplayWindow, now: time.Now}
}

// Run settles until ctx ends. It sweeps every project once at start, then waits on usage
// signals (store.WorkUsage) and settles the projects they name, and wakes on its own only
// to bill snapshot storage and for the rare full sweep: an idle platform costs it a few
// commands every few seconds, however many projects it holds.
func (s *Settler) Run(ctx context.Context) error {
	s.sweep(ctx)
	now := time.Now()
	nextAccrual, nextSweep, nextStopRetry := now.Add(s.accrueEvery), now.Add(s.fullSweepEvery), now
	for ctx.Err() == nil {
		now = time.Now()
		if s.enforcer != nil && !now.Before(nextStopRetry) {
			if err := s.enforcer.RetryStops(ctx, now); err != nil && ctx.Err() == nil {
				s.log.Warn("settler: spend-cap stops", "err", err)
			}
			nextStopRetry = now.Add(stopRetryEvery)
		}
		if !now.Before(nextAccrual) {
			if err := s.AccrueSnapshots(ctx, now); err != nil && ctx.Err() == nil {
				s.log.Warn("settler: snapshot storage", "err", err)
			}
			nextAccrual = now.Add(s.accrueEvery)
		}
		if !now.Before(nextSweep) {
			s.sweep(ctx)
			nextSweep = now.Add(s.fullSweepEvery)
		}
		wake := now.Add(maxWait)
		for _, t := range []time.Time{nextAccrual, nextSweep} {
			if t.Before(wake) {
				wake = t
			}
		}
		if !wake.After(now) {
			continue
		}
		sigs, err := s.store.Signals(ctx, store.WorkUsage, settlerGroup, s.consumer, wake.Sub(now), 64)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("settler: read usage signals", "err", err)
				sleep(ctx, retryAfter)
			}
			continue
		}
		var handled []store.Signal
		for _, sg := range sigs {
			// Deleted while pending (XADD's MAXLEN trims pending entries too): no project,
			// nothing to settle. Unacknowledged, it would answer every read again, alone, at once.
			if sg.Project == "" {
				handled = append(handled, sg)
			}
		}
		failed := false
		for _, p := range store.SignalProjects(sigs) {
			if err := s.drain(ctx, p); err != nil {
				failed = true
				if ctx.Err() == nil && !errors.Is(err, errSettlementHeld) {
					s.log.Warn("settler", "project", p, "err", err)
				}
				continue // its signals stay unacknowledged: read again
			}
			for _, sg := range sigs {
				if sg.Project == p {
					handled = append(handled, sg)
				}
			}
		}
		if err := s.store.AckSignals(ctx, store.WorkUsage, settlerGroup, handled); err != nil && ctx.Err() == nil {
			s.log.Warn("settler: acknowledge signals", "err", err)
		}
		if failed {
			sleep(ctx, retryAfter)
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// drain settles the project until its stream has nothing waiting. When another settler holds
// the project's lock it answers errSettlementHeld, so that the signals that named the project
// are read again (after retryAfter) rather than acknowledged: the holder was asked for another
// round, but a holder whose round failed (its Redis primary was killed mid-round, and its
// release with it) never makes that round, and its lock holds for PlacementLease.
// Acknowledged meanwhile, the last signals of a chaos test's sessions left their usage
// unsettled until the next full sweep, minutes later.
func (s *Settler) drain(ctx context.Context, project string) error {
	_, err := s.settleProject(ctx, project)
	return err
}

// errSettlementHeld: another settler holds the project's settlement lock (drain).
var errSettlementHeld = errors.New("another settler holds the project's settlement lock")

// sweep is the one walk over every project, at start and every FullSweepEvery: a round
// trip per few hundred projects finds the usage streams with records the settlers have not
// settled (delivered to none, or left unacknowledged), which it settles; it indexes the
// projects with snapshots, for accrual; and it prunes what no reader needs any more from
// the projects whose streams it leaves with nothing unsettled (prune).
func (s *Settler) sweep(ctx context.Context) {
	if err := s.store.ForgetIdleConsumers(ctx, store.WorkUsage, settlerGroup, store.IdleConsumerAge); err != nil && ctx.Err() == nil {
		s.log.Warn("settler: forget idle consumers", "err", err)
	}
	projects, err := s.store.Projects(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("settler: sweep", "err", err)
		}
		return
	}
	if err := s.store.IndexSnapshotProjects(ctx, projects); err != nil && ctx.Err() == nil {
		s.log.Warn("settler: sweep", "err", err)
	}
	waiting, err := s.unsettled(ctx, projects)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("settler: sweep", "err", err)
		}
		return
	}
	unsettledLeft := map[string]bool{}
	for _, p := range waiting {
		if err := s.drain(ctx, p); err != nil {
			unsettledLeft[p] = true
			if ctx.Err() == nil && !errors.Is(err, errSettlementHeld) {
				s.log.Warn("settler", "project", p, "err", err)
			}
		}
	}
	settled := slices.DeleteFunc(slices.Clone(projects), func(p string) bool { return unsettledLeft[p] })
	if err := s.prune(ctx, settled, s.now()); err != nil && ctx.Err() == nil {
		s.log.Warn("settler: sweep", "err", err)
	}
}

// unsettled answers the projects, of projects, whose usage stream has records the
// settlers' group has not delivered or not acknowledged (or has no group yet).
func (s *Settler) unsettled(ctx context.Context, projects []string) ([]string, error) {
	const batch = 500
	var out []string
	for start := 0; start < len(projects); start += batch {
		part := projects[start:min(start+batch, len(projects))]
		cmds := make([]*redis.XInfoGroupsCmd, len(part))
		_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, project := range part {
				cmds[i] = p.XInfoGroups(ctx, store.ProjectKeys(project).UsageStream())
			}
			return nil
		})
		for i, c := range cmds {
			groups, err := c.Result()
			if err != nil {
				if strings.Contains(err.Error(), "no such key") {
					continue // no usage ever recorded
				}
				return nil, fmt.Errorf("usage stream of %s: %w", part[i], err)
			}
			g := slices.IndexFunc(groups, func(g redis.XInfoGroup) bool { return g.Name == settlerGroup })
			if g < 0 || groups[g].Pending > 0 || groups[g].Lag != 0 {
				out = append(out, part[i])
			}
		}
	}
	return out, nil
}

func (s *Settler) ensureGroup(ctx context.Context, project string) error {
	err := s.rdb.XGroupCreateMkStream(ctx, store.ProjectKeys(project).UsageStream(), settlerGroup, "0").Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return err
	}
	return nil
}

// SettleProject settles everything waiting in one project's stream and answers how many
// records it handled. It works under the project's settlement lock (store.LockSettlement):
// the settle script counts each session's records once by their seq, so two settlers working
// on one project at once could settle a later batch before an earlier one and count the
// earlier one as a replay. When another settler holds the lock it answers 0 at once, having
// asked that settler for another round.
func (s *Settler) SettleProject(ctx context.Context, project string) (int, error) {
	n, err := s.settleProject(ctx, project)
	if errors.Is(err, errSettlementHeld) {
		return n, nil
	}
	return n, err
}

// settleProject is SettleProject that answers errSettlementHeld when another settler holds
// the lock.
// capActTimeout bounds the decisions and stops of the caps a settle crossed (Caps.act).
const capActTimeout = time.Minute

func (s *Settler) settleProject(ctx context.Context, project string) (total int, err error) {
	if err := s.ensureGroup(ctx, project); err != nil {
		return 0, err
	}
	lock, err := s.store.LockSettlement(ctx, project)
	if err != nil {
		return 0, err
	}
	if lock == nil {
		return 0, errSettlementHeld
	}
	if s.caps != nil {
		// After the lock is released (every return below releases it, or lost it): a cap's
		// stops call nodes, which may outlast the lock's lease, and a second settler would
		// then settle the project alongside this one.
		// Under a context of their own: a cap flagged here is never flagged again this
		// month, so stops skipped for a settle cut short (a shutdown) would never run.
		defer func() {
			actCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), capActTimeout)
			defer cancel()
			s.caps.act(actCtx, project)
		}()
	}
	for {
		n, err := s.settleBatch(ctx, project)
		total += n
		if err != nil {
			_ = lock.Release(context.WithoutCancel(ctx))
			return total, err
		}
		if n > 0 {
			if err := lock.Renew(ctx); err != nil {
				return total, err
			}
			continue
		}
		again, err := lock.Done(context.WithoutCancel(ctx))
		if err != nil || !again {
			return total, err
		}
	}
}

// settleBatch settles one batch of the project's stream, oldest first: the records another
// consumer read and never acknowledged (with the lock held, nobody else is working on them:
// that settler died or lost its lease), then this consumer's own, then new ones.
func (s *Settler) settleBatch(ctx context.Context, project string) (int, error) {
	stream := store.ProjectKeys(project).UsageStream()
	if _, _, err := s.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: stream, Group: settlerGroup,
		Consumer: s.consumer, MinIdle: 0, Start: "0", Count: s.batch}).Result(); err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	for _, start := range []string{"0", ">"} {
		res, err := s.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: settlerGroup, Consumer: s.consumer,
			Streams: []string{stream, start}, Count: s.batch, Block: -1}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, err
		}
		total := 0
		for _, st := range res {
			n, err := s.settle(ctx, project, st.Messages)
			total += n
			if err != nil {
				return total, err
			}
		}
		if total > 0 {
			return total, nil // one batch at a time: own pending first, new ones after
		}
	}
	return 0, nil
}

// run is consecutive records of one session in one hour, settled in one script call.
type run struct {
	first, last Record
	sum         Record // usage sums; cost in costNano
	costNano    int64
	records     []Record
}

// runs groups a batch by session and hour, keeping each session's order.
func (s *Settler) runs(project string, msgs []redis.XMessage) []*run {
	var out []*run
	open := map[string]*run{}
	for _, m := range msgs {
		r, err := DecodeRecord(m.Values)
		if err != nil || r.ProjectID != project {
			s.log.Error("settler: dropping bad record", "id", m.ID, "err", err)
			continue
		}
		hour := time.UnixMilli(r.ToMs).UTC().Format("2006010215")
		k := r.SessionID + "|" + hour
		cur := open[k]
		if cur == nil || r.Seq != cur.last.Seq+1 {
			cur = &run{first: r}
			open[k] = cur
			out = append(out, cur)
		}
		cur.last = r
		cur.records = append(cur.records, r)
		cur.sum.SessionMs += r.SessionMs
		cur.sum.PausedMs += r.PausedMs
		cur.sum.CPUMs += r.CPUMs
		cur.sum.MemGiBMs += r.MemGiBMs
		cur.sum.EgressBytes += r.EgressBytes
		cur.costNano += s.prices.Cost(r)
	}
	return out
}

// settle applies a batch in one pipeline, then acknowledges it and trims the stream
// (ackScript). A crash between the two replays the batch, which the seq check turns into
// no-ops.
func (s *Settler) settle(ctx context.Context, project string, msgs []redis.XMessage) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	if err := s.apply(ctx, project, s.runs(project, msgs)); err != nil {
		return 0, err
	}
	args := make([]any, 0, 1+len(msgs))
	args = append(args, settlerGroup)
	for _, m := range msgs {
		args = append(args, m.ID)
	}
	if err := ackScript.Run(ctx, s.rdb, []string{store.ProjectKeys(project).UsageStream()}, args...).Err(); err != nil {
		return 0, fmt.Errorf("settle ack: %w", err)
	}
	return len(msgs), nil
}

// apply settles runs, a pipeline per wave (nextWave).
func (s *Settler) apply(ctx context.Context, project string, runs []*run) error {
	for len(runs) > 0 {
		var wave []*run
		wave, runs = nextWave(runs)
		if err := s.applyWave(ctx, project, wave); err != nil {
			return err
		}
	}
	return nil
}

// nextWave answers the runs that may go in one pipeline, and the rest. A run of more than one
// record may straddle what an interrupted settler applied and be settled record by record
// after its pipeline; a later run of its session applied in the same pipeline would move the
// session's mark past those records, which would then count as replays and be lost. So a
// session's runs after one of more records wait for the next wave (in order).
func nextWave(runs []*run) (wave, rest []*run) {
	mayStraddle, waiting := map[string]bool{}, map[string]bool{}
	for _, r := range runs {
		id := r.first.SessionID
		if mayStraddle[id] || waiting[id] {
			waiting[id] = true
			rest = append(rest, r)
			continue
		}
		wave = append(wave, r)
		if len(r.records) > 1 {
			mayStraddle[id] = true
		}
	}
	return wave, rest
}

// applyWave settles one wave of runs in one pipeline.
func (s *Settler) applyWave(ctx context.Context, project string, runs []*run) error {
	k := store.ProjectKeys(project)
	cmds := make([]*redis.Cmd, len(runs))
	now := s.now().UnixMilli()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range runs {
			at := time.UnixMilli(r.last.ToMs).UTC()
			cmds[i] = settleScript.EvalSha(ctx, p, []string{k.UsageSeq(), k.Spend(), k.UsageHour(at), k.SessionHash(r.first.SessionID),
				k.UsageSeqAt(), k.SpendHours(), k.SpendDays(), k.SpendMonths()},
				r.first.SessionID, r.first.Seq, r.first.EndUserID, r.sum.SessionMs, r.sum.PausedMs, r.sum.CPUMs, r.sum.MemGiBMs,
				r.sum.EgressBytes, r.costNano, at.Format("2006010215"), at.Format("20060102"), monthOf(at), r.last.Seq,
				now, at.Truncate(time.Hour).UnixMilli(), dayStart(at).UnixMilli(), monthEnd(at).UnixMilli())
		}
		return nil
	})
	if isNoScript(err) {
		// First use on this server: load the script and redo the batch (the seq check makes
		// the redo exact).
		if err := settleScript.Load(ctx, s.rdb).Err(); err != nil {
			return fmt.Errorf("settle: load script: %w", err)
		}
		return s.applyWave(ctx, project, runs)
	}
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	var split, settled []*run
	for i, r := range runs {
		res, err := cmds[i].Int64Slice()
		if err != nil {
			return fmt.Errorf("settle %s: %w", r.first.ID(), err)
		}
		switch {
		case res[0] == -1: // straddles what a previous, interrupted settler applied
			split = append(split, r.split(s.prices)...)
			continue
		case res[0] == 1 && s.caps != nil:
			s.caps.observe(ctx, r.last, res[1], res[2])
		}
		// Applied now or before: the session's usage to date may still lack it (a crash
		// between the two), and the store adds each run once.
		settled = append(settled, r)
	}
	if err := s.addToSessions(ctx, project, settled); err != nil {
		return err
	}
	if len(split) > 0 {
		return s.apply(ctx, project, split)
	}
	return nil
}

// split is the run as runs of one record each.
func (r *run) split(prices Prices) []*run {
	out := make([]*run, len(r.records))
	for i, rec := range r.records {
		out[i] = &run{first: rec, last: rec, sum: rec, costNano: prices.Cost(rec), records: []Record{rec}}
	}
	return out
}

// addToSessions adds settled runs to their sessions' usage to date, a round trip per wave
// (nextWave: the usage to date has its own mark); a run that an earlier, interrupted settler
// added in part is added again record by record.
func (s *Settler) addToSessions(ctx context.Context, project string, runs []*run) error {
	for len(runs) > 0 {
		var wave []*run
		wave, runs = nextWave(runs)
		if err := s.addWaveToSessions(ctx, project, wave); err != nil {
			return err
		}
	}
	return nil
}

// addWaveToSessions is addToSessions for one wave.
func (s *Settler) addWaveToSessions(ctx context.Context, project string, runs []*run) error {
	adds := make([]store.SessionUsage, len(runs))
	for i, r := range runs {
		adds[i] = store.SessionUsage{ID: r.first.SessionID, FromSeq: r.first.Seq, ToSeq: r.last.Seq,
			SessionMs: r.sum.SessionMs, PausedMs: r.sum.PausedMs, CPUMs: r.sum.CPUMs, MemGiBMs: r.sum.MemGiBMs,
			EgressBytes: r.sum.EgressBytes, CostNano: r.costNano}
	}
	straddled, err := s.store.AddSessionUsage(ctx, project, adds)
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	var split []*run
	for _, i := range straddled {
		split = append(split, runs[i].split(s.prices)...)
	}
	if len(split) > 0 {
		return s.addToSessions(ctx, project, split)
	}
	return nil
}

func isNoScript(err error) bool { return err != nil && strings.Contains(err.Error(), "NOSCRIPT") }
