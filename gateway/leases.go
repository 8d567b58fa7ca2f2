package gateway

import (
	"context"
	"sync"
	"time"
)

// Work leases (store/leases.go) cover work that one gateway does and another must take over
// or end should that one die: a desktop's transition (desktop_recovery.go), a session's
// snapshot (snapshot_recovery.go) and a run (run_recovery.go). The gateway doing the work renews its lease while it
// works; every gateway's recovery loops wait for leases that ran out.

// DefaultWorkLease is how long such work may go unrenewed before another gateway takes it
// over.
const DefaultWorkLease = 30 * time.Second

func (s *Server) workLease() time.Duration {
	if s.WorkLease > 0 {
		return s.WorkLease
	}
	return DefaultWorkLease
}

// deadlinePoll bounds the deadline loops' wait, so that deadlines other gateways set (which
// do not kick this one) are seen within it.
const deadlinePoll = 5 * time.Second

// keepRenewed renews a lease with renew every third of its length until the returned stop is
// called (stop waits for a renewal under way), ctx ends, or renew answers that the lease is
// held by another work now.
func (s *Server) keepRenewed(ctx context.Context, what, id string, renew func(ctx context.Context, until time.Time) (bool, error)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		lease := s.workLease()
		t := time.NewTicker(lease / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				held, err := renew(ctx, s.Now().Add(lease))
				if err != nil && ctx.Err() == nil {
					s.log.Warn(what+": renew the work lease", "id", id, "err", err)
				}
				if err == nil && !held {
					return // a newer work (or a recovery) holds it now
				}
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// workingLeases is the work under lease that a server does: for each thing worked on (a
// desktop, a session), the lease token of its newest work still running here. A recovery
// loop asks it before it takes a lapsed lease over: a lease can lapse while its work still
// runs here (its renewals failed: Redis away, or a host so loaded that they came late).
type workingLeases[R comparable] struct {
	mu   sync.Mutex
	work map[R]string
}

func (w *workingLeases[R]) begin(ref R, token string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.work == nil {
		w.work = map[R]string{}
	}
	w.work[ref] = token
}

// end forgets token's work, unless a newer work on ref runs.
func (w *workingLeases[R]) end(ref R, token string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.work[ref] == token {
		delete(w.work, ref)
	}
}

func (w *workingLeases[R]) working(ref R) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	token, ok := w.work[ref]
	return token, ok
}

// runDeadlines handles what due answers (a sorted set of deadlines: desktops falling idle,
// leases running out), a batch at a time, waiting until the next deadline, a kick, or
// deadlinePoll (deadlines that other gateways set do not kick this one), until ctx ends.
func runDeadlines[R any](ctx context.Context, s *Server, what string,
	due func(context.Context, time.Time, int) ([]R, time.Time, error),
	handle func(context.Context, R, time.Time), kick <-chan struct{}) {
	const batch = 16
	for ctx.Err() == nil {
		now := s.Now()
		refs, next, err := due(ctx, now, batch)
		if err != nil && ctx.Err() == nil {
			s.log.Warn(what, "err", err)
		}
		for _, ref := range refs {
			handle(ctx, ref, now)
		}
		wait := deadlinePoll
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(s.Now()), 10*time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-kick:
			t.Stop()
		case <-t.C:
		}
	}
}
