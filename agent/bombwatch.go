package agent

import "time"

// bombWatch decides, from samples of the guest's process count, when its processes have
// pressed on their limit long enough to be a fork bomb.
//
// A bomb does not sit exactly at the limit: every subshell whose fork fails exits, so the
// count dips below the limit and refills between samples, and on a busy host a sample may
// never catch it exactly at the limit. Watching for "at the limit" alone let a bomb that
// sampled one short now and then run on until its sandbox died (gVisor's ptrace platform
// adds host threads all the while). So the watch arms when the count comes within a
// twentieth of the limit (forks are failing, or about to) and stays armed while it stays
// within a tenth; armed for atLimitFor, it fires. A workload that merely runs many processes
// stays below that and is never armed; one that touches it and falls back below nine tenths
// disarms.
type bombWatch struct {
	max   int
	since time.Time // when armed; zero when not
}

// observe takes one sample and answers whether the guest's processes should all be ended.
func (w *bombWatch) observe(cur int, now time.Time) bool {
	switch {
	case cur < w.max-w.max/10:
		w.since = time.Time{}
		return false
	case w.since.IsZero():
		if cur >= w.max-w.max/20 {
			w.since = now
		}
		return false
	}
	return now.Sub(w.since) >= atLimitFor
}
