package gateway

import (
	"sync"
	"sync/atomic"

	"wb/store"
)

// startWaits are the runs that wait for their session to start (waitRunning), each told by
// the store's announcement (store.WatchStarts), over the one subscription of this gateway,
// instead of looking at the session every millisecond. A session announced that no run here
// waits for is dropped.
type startWaits struct {
	// epoch counts the subscription's changes: odd while it holds. A run may rely on the
	// announcement only while the epoch it read before a look is still odd and current: an
	// announcement made while the subscription was down is lost.
	epoch atomic.Uint64
	mu    sync.Mutex
	m     map[store.SessionRef][]chan struct{}
	n     int // the waits in m
}

// maxStartWaits bounds the runs that wait on announcements; more wait by looking alone. (The
// runs that wait are bounded already, by each project's MaxConcurrentExecs and MaxAsyncRuns;
// this bounds them across projects.)
const maxStartWaits = 1 << 16

func newStartWaits() *startWaits {
	return &startWaits{m: map[store.SessionRef][]chan struct{}{}}
}

// add registers a wait for r's start: the channel is signalled when it is announced, or when
// the subscription is lost. done unregisters it. A nil channel: too many wait already.
func (w *startWaits) add(r store.SessionRef) (ch chan struct{}, done func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n >= maxStartWaits {
		return nil, func() {}
	}
	ch = make(chan struct{}, 1)
	w.m[r] = append(w.m[r], ch)
	w.n++
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		chs := w.m[r]
		for i, c := range chs {
			if c == ch {
				chs = append(chs[:i], chs[i+1:]...)
				w.n--
				break
			}
		}
		if len(chs) == 0 {
			delete(w.m, r)
		} else {
			w.m[r] = chs
		}
	}
}

// started wakes the runs that wait for r.
func (w *startWaits) started(r store.SessionRef) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[r] {
		wake(ch)
	}
}

// live is told whether the subscription holds. Once it is lost every run wakes, to look at its
// session and look often from then on.
func (w *startWaits) live(live bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := w.epoch.Load(); (e%2 == 1) != live {
		w.epoch.Store(e + 1)
	}
	if !live {
		for _, chs := range w.m {
			for _, ch := range chs {
				wake(ch)
			}
		}
	}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
