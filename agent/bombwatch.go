package agent

import (
	"context"
	"time"
)

// bombWatch decides, from samples of the guest's process count, when its processes have
// pressed on their limit long enough to be a fork bomb.
//
// A bomb does not sit exactly at the limit: every subshell whose fork fails exits, so the
// count dips below the limit and refills between samples, and on a busy host a sample may
// never catch it exactly at the limit. Watching for "at the limit" alone let a bomb that
// sampled one short now and then run on until its sandbox died (gVisor's ptrace platform
// adds host threads all the while). So the watch arms when the count comes within a
// twentieth of the limit (forks are failing, or about to) and stays armed while it stays
// within a tenth; armed for atLimitFor, it fires at a sample within that tenth. A workload
// that merely runs many processes stays below that and is never armed; one that touches it
// and falls back disarms: at once below half the limit, else at its second sample in a row
// below nine tenths. One dip does not: on a loaded host, with the agent starved and its
// samples seconds apart, a bomb sampled 256, 219, 251, 256 was disarmed by the 219, fired
// 1.7 s later than armed through it, and its sandbox died of its host threads first.
type bombWatch struct {
	max   int
	since time.Time // when armed; zero when not
	dips  int       // samples in a row below nine tenths while armed
}

// observe takes one sample and answers whether the guest's processes should all be ended.
func (w *bombWatch) observe(cur int, now time.Time) bool {
	switch {
	case cur < w.max/2:
		*w = bombWatch{max: w.max}
		return false
	case cur < w.max-w.max/10:
		if w.dips++; w.dips >= 2 {
			*w = bombWatch{max: w.max}
		}
		return false
	}
	w.dips = 0
	if w.since.IsZero() {
		if cur >= w.max-w.max/20 {
			w.since = now
		}
		return false
	}
	return now.Sub(w.since) >= atLimitFor
}

// bombGuard samples the guest's process count and ends every process once bombWatch fires,
// until its context ends.
//
// Under gVisor's ptrace platform every sample (a timer, a read, and the Go runtime's clock
// calls around them, each a trapped system call) costs the guest's host about 3 ms of CPU:
// sampling every 100 ms was 3 % of a core for each guest, idle or running one quiet process,
// where the sandbox alone costs 0.1 %. So:
//   - while the count is no more than idle() (the runners waiting for their code, which fork
//     nothing before the agent hands it them), nothing can fork until the agent starts a
//     process or hands a runner its code, and the guard sleeps until woken says one of those
//     happened;
//   - while the count stays below a quarter of the limit and does not rise, the interval
//     doubles from every to slowest. A bomb rises through that quarter first, sampled every
//     `every` from its first rise (under ptrace a bomb takes seconds to reach its limit).
type bombGuard struct {
	max     int
	every   time.Duration
	slowest time.Duration
	count   func() (int, error)
	idle    func() int
	// asleep bounds a sleep while nothing can fork (0: until woken): a runner is trusted to
	// fork nothing before its hand-off, and under gVisor guest root can start one through the
	// agent's socket, so the guard still looks now and then.
	asleep time.Duration
	// woken holds a value after the agent started a process or handed a runner its code;
	// the guard re-reads idle and count after each value it takes, so none is missed.
	woken <-chan struct{}
	// endAll ends every process of the guest; since is when the watch armed.
	endAll func(since time.Time)
}

func (g bombGuard) run(ctx context.Context) {
	timer := time.NewTimer(g.every)
	defer timer.Stop()
	w := bombWatch{max: g.max}
	interval, last := g.every, -1
	for {
		idle := g.idle() // before the count: a claim between the two shows as one more
		cur, err := g.count()
		switch {
		case err != nil:
			interval = g.every
		case cur <= idle && w.since.IsZero():
			var look <-chan time.Time // nil: never
			if g.asleep > 0 {
				timer.Reset(g.asleep)
				look = timer.C
			}
			select {
			case <-ctx.Done():
				return
			case <-g.woken:
				timer.Stop() // (Go 1.23's timers: no stale tick survives a Stop or a Reset)
			case <-look:
			}
			interval, last = g.every, -1
			continue // at once: what woke the guard may be a bomb
		default:
			if w.observe(cur, time.Now()) {
				g.endAll(w.since)
				w = bombWatch{max: g.max}
			}
			if cur >= g.max/4 || cur > last {
				interval = g.every
			} else {
				interval = min(2*interval, g.slowest)
			}
			last = cur
		}
		timer.Reset(interval)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
	}
}
