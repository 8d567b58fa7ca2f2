package store

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// sharedTrips runs one script for concurrent callers, who share round trips to Redis under
// load. A call made while fewer than maxTripsInFlight of the script's round trips are in flight
// goes out at once, alone, from its caller. One made while that many are waits; as each of
// those ends, a worker (started then, gone when idle) takes the calls waiting, up to
// maxTripBatch at a time, and sends them as one pipeline. Redis then reads many scripts with
// one read and answers them with one write, where each call on a connection of its own cost it
// a read, a write and a turn of its event loop: one Redis, the platform's serial part, admits
// more creates a second. A lone call pays nothing (it goes at once, as before), a waiting one
// at most the round trip it waits for.
type sharedTrips struct {
	rdb    redis.UniversalClient
	script *redis.Script

	mu      sync.Mutex
	senders int // callers and workers sending a round trip, or about to
	waiting []*tripCall
}

const (
	// maxTripsInFlight bounds the round trips of one script in flight at once. Measured on
	// a machine of two CPUs (the gateway, Redis and wrk on it), CPU a create at saturation
	// (gateway, Redis): unshared 91–96 and 68–71 µs; 4: 89–96 and 65–70; 2: 87–93 and
	// 61–65; 1: 83–86 and 60–61, but at half of saturation, where creates overlap often,
	// 1 added some 200 µs to a create's median (it waits for the round trip in flight).
	maxTripsInFlight = 2
	// maxTripBatch bounds a shared round trip: what a pipeline of that many creates writes
	// and reads (about 1.5 KiB each) stays well within a socket buffer.
	maxTripBatch = 64
)

// tripCall is one call of the script.
type tripCall struct {
	ctx  context.Context
	keys []string
	args []any

	res  []string
	err  error
	done chan struct{} // closed once res and err are set
}

func newSharedTrips(rdb redis.UniversalClient, script *redis.Script) *sharedTrips {
	return &sharedTrips{rdb: rdb, script: script}
}

// run runs the script with keys and args and answers its reply as strings.
func (t *sharedTrips) run(ctx context.Context, keys []string, args ...any) ([]string, error) {
	t.mu.Lock()
	if t.senders < maxTripsInFlight {
		t.senders++
		t.mu.Unlock()
		// send's round trip of one call, without a tripCall (three of a create's allocations).
		res, err := t.script.Run(ctx, t.rdb, keys, args...).StringSlice()
		t.handOff()
		return res, err
	}
	c := &tripCall{ctx: ctx, keys: keys, args: args, done: make(chan struct{})}
	t.waiting = append(t.waiting, c) // a sender's handOff or work takes it
	t.mu.Unlock()
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
	}
	// Gone before it went out: it leaves the queue. Already taken into a round trip, it
	// waits for that, which Redis's timeouts bound.
	t.mu.Lock()
	for i, w := range t.waiting {
		if w == c {
			t.waiting = append(t.waiting[:i:i], t.waiting[i+1:]...)
			t.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	t.mu.Unlock()
	<-c.done
	return c.res, c.err
}

// handOff is the end of a caller's own round trip: the calls that came meanwhile go on with
// a worker, which takes the caller's place among the senders.
func (t *sharedTrips) handOff() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.waiting) == 0 {
		t.senders--
		return
	}
	go t.work()
}

// work sends the calls waiting until there are none.
func (t *sharedTrips) work() {
	for {
		t.mu.Lock()
		if len(t.waiting) == 0 {
			t.senders--
			t.mu.Unlock()
			return
		}
		n := min(len(t.waiting), maxTripBatch)
		batch := t.waiting[:n:n]
		t.waiting = append([]*tripCall(nil), t.waiting[n:]...)
		t.mu.Unlock()
		t.send(batch)
	}
}

// send makes one round trip of batch and sets each call's answer.
func (t *sharedTrips) send(batch []*tripCall) {
	if len(batch) == 1 {
		c := batch[0]
		c.res, c.err = t.script.Run(c.ctx, t.rdb, c.keys, c.args...).StringSlice()
		close(c.done)
		return
	}
	// Not one caller's context: a caller that gives up must not fail the others' calls.
	ctx := context.WithoutCancel(batch[0].ctx)
	pipe := t.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, c := range batch {
		cmds[i] = t.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // each command's own error is read below
	for i, c := range batch {
		c.res, c.err = cmds[i].StringSlice()
		if c.err != nil && redis.HasErrorPrefix(c.err, "NOSCRIPT") {
			// Redis lost its scripts (a restart, a failover): Run loads the script again.
			c.res, c.err = t.script.Run(ctx, t.rdb, c.keys, c.args...).StringSlice()
		}
		close(c.done)
	}
}
