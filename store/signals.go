package store

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Work names a kind of background work that a project can have waiting: each kind has a
// signal stream that every writer of such work appends the project to, and that the worker
// of that kind reads with a consumer group and a blocking read. So an idle platform does
// nothing: no worker walks every project to find the few with work.
//
// A signal is a hint, delivered at least once: the worker that reads it handles all of the
// project's waiting work of that kind (its own per-project stream, lists, sets), then
// acknowledges it. A signal lost (a writer that died between its write and its signal) costs
// latency, not work: each worker sweeps every project when it starts and, rarely, after.
type Work string

const (
	// WorkOutbox: the project's outbox has events for the webhook dispatcher.
	WorkOutbox Work = "outbox"
	// WorkUsage: the project's usage stream has records for the settler.
	WorkUsage Work = "usage"
	// WorkPending: the project has a pending session for the placer.
	WorkPending Work = "pending"
)

// signalMaxLen bounds a signal stream (approximately, as XADD MAXLEN ~ does): signals only
// ever name projects with work, so the newest 100,000 are plenty, and a burst cannot grow
// the stream without bound. signalMaxLenLua is the same number as the scripts spell it.
const (
	signalMaxLen    = 100_000
	signalMaxLenLua = "100000"
)

// signalClaimIdle is how long a signal may stay read and unacknowledged (a worker died
// handling it) before another worker claims it.
const signalClaimIdle = 30 * time.Second

// Signal is one read signal: the project with work, and the stream entry to acknowledge.
// Project is empty for a signal deleted from the stream while it was pending (XADD's MAXLEN
// trims pending entries too): nothing to handle, but a worker must acknowledge it, or its
// every read answers it again, at once.
type Signal struct {
	ID      string
	Project string
}

// Signal appends project to the signal stream of w. Writers call it after (or pipelined
// with) the write that made the work.
func (s *Store) Signal(ctx context.Context, w Work, project string) error {
	return signal(ctx, s.rdb, w, project).Err()
}

// signalAfter signals each kind of work in ws for project, in one round trip, after a write
// that made it. A failed signal is not the write's failure (the write is done): the work
// waits for the worker's next sweep instead.
func (s *Store) signalAfter(ctx context.Context, project string, ws ...Work) {
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, w := range ws {
			signal(ctx, p, w, project)
		}
		return nil
	})
}

// signal queues the signal on c, a client or a pipeline.
func signal(ctx context.Context, c redis.Cmdable, w Work, project string) *redis.StringCmd {
	return c.XAdd(ctx, &redis.XAddArgs{Stream: signalKey(w), MaxLen: signalMaxLen, Approx: true,
		Values: []any{"p", project}})
}

// Signals reads signals of w for consumer in group: first any this consumer read and never
// acknowledged, then any another consumer left unacknowledged for signalClaimIdle, then new
// ones, waiting up to wait for one (0: do not wait). It answers at most count signals, and
// none (no error) when wait passes. The group is created on first use and reads the stream
// from its start: no signal sent before a worker first ran is lost. When ctx ends during the
// wait it answers ctx's error at once (a blocking read does not end with its context: it
// ends by itself within wait, and what it read stays unacknowledged, for this consumer's
// next read).
func (s *Store) Signals(ctx context.Context, w Work, group, consumer string, wait time.Duration, count int) ([]Signal, error) {
	key := signalKey(w)
	// Own unacknowledged signals first (this consumer restarted under the same name), then
	// claimed ones: one round trip, as a worker reads once per wake.
	res, err := unreadSignalsScript.Run(ctx, s.rdb, []string{key}, group, consumer, count, signalClaimIdle.Milliseconds()).Slice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	if got := scriptSignals(res); len(got) > 0 {
		return got, nil
	}
	if wait <= 0 {
		return s.readSignals(ctx, key, group, consumer, ">", -1, count) // go-redis: -1 is no BLOCK
	}
	type read struct {
		sigs []Signal
		err  error
	}
	done := make(chan read, 1)
	go func() {
		sigs, err := s.readSignals(context.WithoutCancel(ctx), key, group, consumer, ">", wait, count)
		done <- read{sigs, err}
	}()
	select {
	case r := <-done:
		return r.sigs, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *Store) readSignals(ctx context.Context, key, group, consumer, start string, block time.Duration, count int) ([]Signal, error) {
	res, err := s.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: consumer,
		Streams: []string{key, start}, Count: int64(count), Block: blockArg(block)}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Signal
	for _, st := range res {
		out = append(out, toSignals(st.Messages)...)
	}
	return out, nil
}

// unreadSignalsScript answers the signals a read answers before it waits for new ones: the
// consumer's own unacknowledged ones or, if it has none, those another consumer left
// unacknowledged for the claim idle (claimed for this one). A group that does not exist is
// made, reading the stream from its start (a new group has nothing of either).
//
// KEYS: signal stream. ARGV: group, consumer, count, claim idle ms.
// Answers the entries, each {id, {field, value, …}} (no fields: deleted since it was read).
var unreadSignalsScript = redis.NewScript(`
local r = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '0')
if type(r) == 'table' and r.err then
  if not string.find(r.err, 'NOGROUP', 1, true) then return r end
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
  return {}
end
if type(r) == 'table' and r[1] and #r[1][2] > 0 then return r[1][2] end
return redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[4], '0', 'COUNT', ARGV[3])[2]
`)

// scriptSignals reads the entries unreadSignalsScript answers.
func scriptSignals(entries []any) []Signal {
	out := make([]Signal, 0, len(entries))
	for _, e := range entries {
		ent, ok := e.([]any)
		if !ok || len(ent) == 0 {
			continue
		}
		id, _ := ent[0].(string)
		sg := Signal{ID: id}
		if len(ent) > 1 {
			fields, _ := ent[1].([]any)
			for i := 0; i+1 < len(fields); i += 2 {
				if f, _ := fields[i].(string); f == "p" {
					sg.Project, _ = fields[i+1].(string)
				}
			}
		}
		out = append(out, sg)
	}
	return out
}

func toSignals(msgs []redis.XMessage) []Signal {
	out := make([]Signal, 0, len(msgs))
	for _, m := range msgs {
		p, _ := m.Values["p"].(string)
		out = append(out, Signal{ID: m.ID, Project: p})
	}
	return out
}

// AckSignals acknowledges handled signals of w in group and deletes them: a signal is read
// by one group per kind of work, so once acknowledged it has no reader left.
func (s *Store) AckSignals(ctx context.Context, w Work, group string, sigs []Signal) error {
	if len(sigs) == 0 {
		return nil
	}
	ids := make([]string, len(sigs))
	for i, sg := range sigs {
		ids[i] = sg.ID
	}
	key := signalKey(w)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.XAck(ctx, key, group, ids...)
		p.XDel(ctx, key, ids...)
		return nil
	})
	return err
}

// SignalProjects answers the distinct projects of sigs, in the order first seen: a burst
// of one project's events is handled once.
func SignalProjects(sigs []Signal) []string {
	var out []string
	for _, sg := range sigs {
		if sg.Project != "" && !slices.Contains(out, sg.Project) {
			out = append(out, sg.Project)
		}
	}
	return out
}

// IdleConsumerAge is how long a consumer of a signal group may stay silent, with nothing
// pending, before workers remove it (ForgetIdleConsumers): every worker that ever ran joined
// the group under its own name, and a restarted one never comes back under the old.
const IdleConsumerAge = time.Hour

// ForgetIdleConsumers removes from group's consumers of w's signals those silent for longer
// than age with nothing pending (what a dead one left pending is claimed by a live one
// first, see Signals). Workers call it from their rare sweeps, with IdleConsumerAge, so the
// group does not grow with every restart.
func (s *Store) ForgetIdleConsumers(ctx context.Context, w Work, group string, age time.Duration) error {
	key := signalKey(w)
	consumers, err := s.rdb.XInfoConsumers(ctx, key, group).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") || strings.Contains(err.Error(), "NOGROUP") {
			return nil
		}
		return err
	}
	for _, c := range consumers {
		if c.Pending == 0 && c.Idle > age {
			if err := s.rdb.XGroupDelConsumer(ctx, key, group, c.Name).Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

// blockArg is go-redis's Block for a wait: none at or below zero (-1 sends no BLOCK), and
// at least a millisecond above it. go-redis sends whole milliseconds, and BLOCK 0 blocks
// for ever: a wait of 400 µs (a placer whose next deadline was that near) hung the read
// until the client's socket timeout, 10 s later, and the deadline passed unenforced.
func blockArg(wait time.Duration) time.Duration {
	if wait <= 0 {
		return -1
	}
	return max(wait, time.Millisecond)
}
