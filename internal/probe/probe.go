package probe

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrGone is what Until answers when the thing it waits for went away (its gone channel
// closed) before it answered.
var ErrGone = errors.New("gone before it answered")

// Bounds are how long a probe may wait for its answer: First at first, twice as long as the
// last after a probe that ran out of time, at most Max. On a loaded host a gVisor guest's
// answer has taken seconds, and a fixed bound would cancel every probe before its answer (a
// start that never ends); the cap keeps a probe lost on a broken connection from holding the
// wait for long.
type Bounds struct{ First, Max time.Duration }

// Default answers the bounds of guests' and VMMs' probes: 1 s, at most 30 s (on a host at
// a load of 40 an answer may take many seconds; a cap of 8 s would have cancelled each).
func Default() Bounds { return Bounds{First: time.Second, Max: 30 * time.Second} }

// retry is the pause after a probe that failed at once (nothing listening yet).
const retry = 5 * time.Millisecond

// Until calls probe, each call bounded as b says, until one answers nil (Until answers
// nil), ctx ends (it answers ctx's error and the last probe's), or gone closes (ErrGone; a
// nil gone never does).
func (b Bounds) Until(ctx context.Context, gone <-chan struct{}, probe func(context.Context) error) error {
	wait := b.First
	for {
		pctx, cancel := context.WithTimeout(ctx, wait)
		err := probe(pctx)
		timedOut := errors.Is(pctx.Err(), context.DeadlineExceeded)
		cancel()
		if err == nil {
			return nil
		}
		if timedOut {
			wait = min(2*wait, b.Max)
		}
		select {
		case <-gone:
			return ErrGone
		case <-ctx.Done():
			return fmt.Errorf("%w (last probe: %v)", ctx.Err(), err)
		case <-time.After(retry):
		}
	}
}
