package plugins

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// A plugin whose instances fail to start would have each call try a start, under the start
// deadline (1 s) rather than the call's (20 ms): after restartAfterFailures failed starts in a
// row, calls answer the last failure without starting one, for a period that doubles with each
// failure after (from minRestartHold to maxRestartHold); then one call tries again. Only starts
// count: a call that fails on its input (a trap, a timeout) discards its instance, and the next
// call starts a fresh one, so that crafted inputs cannot hold a plugin back for its other
// callers (fail-open, that skipped its evaluation for up to maxRestartHold).
//
// A start that replaces an instance discarded after a failed call is paced instead: such
// starts begin at least restartCostFactor+1 times the plugin's last start apart, so that starts
// take at most about a tenth of the plugin's time however its calls fail. Its callers wait
// (under their own context), they do not fail: a plugin whose calls all trap, with an
// _initialize that runs for most of the start deadline, would otherwise cost the gateway a
// second of CPU per call. The first such start after a quiet spell begins at once: one that
// waited 9 times the last start after every failure made a runtime check (2 s) after a rare
// trap fail closed when the plugin's start took over 0.2 s.
const (
	restartAfterFailures = 3
	minRestartHold       = time.Second
	maxRestartHold       = 30 * time.Second
	restartCostFactor    = 9
)

// errRetired answers an acquire on a pool whose version was replaced and whose compiled module
// is gone: the caller takes the current plugin set again.
var errRetired = errors.New("plugin version retired")

// pool bounds the instances of one plugin of a project, at one version (digest) and memory
// limit: at most size calls hold one at a time (sem); the idle ones are kept most recently used
// first, so that a steady trickle of calls runs on one warm instance. Each plugin has its own
// pool even where plugins share a module, so that one's failed starts hold back no other.
type pool struct {
	h   *Host
	mod *module
	sem chan struct{}

	mu       sync.Mutex
	idle     []*instance
	retired  bool // replaced: instances are closed as they come back
	users    int  // acquired and not yet released
	released bool // the module reference was given back

	fails     int           // starts that failed in a row
	lastFail  *CallError    // the last of them
	holdUntil time.Time     // once fails reaches restartAfterFailures, no start before this
	hold      time.Duration // the current hold's length

	lastStart time.Duration // how long the last start took
	replace   int           // instances discarded after failed calls and not yet replaced
	restartAt time.Time     // the next paced start's slot
}

func (h *Host) newPool(m *module) *pool {
	return &pool{h: h, mod: m, sem: make(chan struct{}, h.o.PoolSize)}
}

// acquire takes an instance, waiting under ctx while all are busy, and starts one for the
// project's plugin if none is idle. A start failure is a *CallError.
func (p *pool) acquire(ctx context.Context, project, plugin string) (*instance, error) {
	p.mu.Lock()
	if p.released {
		p.mu.Unlock()
		return nil, errRetired
	}
	p.users++
	p.mu.Unlock()

	select {
	case p.sem <- struct{}{}:
	default:
		select {
		case p.sem <- struct{}{}:
		case <-ctx.Done():
			p.done(nil, false)
			return nil, ctx.Err()
		}
	}
	p.mu.Lock()
	var inst *instance
	if n := len(p.idle); n > 0 {
		inst = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
	}
	p.mu.Unlock()
	if inst == nil {
		if ce := p.held(); ce != nil {
			p.done(nil, true)
			return nil, ce
		}
		paced, err := p.paced(ctx)
		if err != nil {
			p.done(nil, true)
			return nil, err
		}
		if paced {
			// An instance may have come back while this call waited.
			p.mu.Lock()
			if n := len(p.idle); n > 0 {
				inst = p.idle[n-1]
				p.idle[n-1] = nil
				p.idle = p.idle[:n-1]
			}
			p.mu.Unlock()
			if inst != nil {
				return inst, nil
			}
		}
		began := time.Now()
		if inst, err = p.h.newInstance(ctx, p.mod, project, plugin); err != nil {
			p.failed(err)
			p.done(nil, true)
			return nil, err
		}
		p.mu.Lock()
		p.fails = 0
		p.lastStart = time.Since(began)
		if paced && p.replace > 0 {
			p.replace--
		}
		p.mu.Unlock()
	}
	return inst, nil
}

// held answers the failure to give a call while starts are held back, and lets one call
// through (holding the others back while it tries) once the hold is over.
func (p *pool) held() *CallError {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fails < restartAfterFailures {
		return nil
	}
	now := time.Now()
	if now.Before(p.holdUntil) {
		return &CallError{Kind: p.lastFail.Kind,
			Cause: fmt.Sprintf("%s (it failed %d times in a row: not restarted for %v)", p.lastFail.Cause, p.fails, p.hold)}
	}
	p.holdUntil = now.Add(p.hold)
	return nil
}

// paced waits, under ctx, for the slot of a start while instances discarded after failed
// calls are not all replaced (restartCostFactor), and reports whether it did: each such start
// takes the next slot, restartCostFactor+1 times the last start after the one before (at once
// when that is past), so that callers waiting together start one at a time (each taking the
// first free slot had them start together, up to the pool's size at once).
func (p *pool) paced(ctx context.Context) (bool, error) {
	p.mu.Lock()
	if p.replace == 0 {
		p.mu.Unlock()
		return false, nil
	}
	at := time.Now()
	if p.restartAt.After(at) {
		at = p.restartAt
	}
	p.restartAt = at.Add((restartCostFactor + 1) * p.lastStart)
	p.mu.Unlock()
	wait := time.Until(at)
	if wait <= 0 {
		return true, nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true, nil
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// failed counts a failed start (a *CallError; the end of a caller's context is none).
func (p *pool) failed(err error) {
	var ce *CallError
	if !errors.As(err, &ce) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fails++
	p.lastFail = ce
	if n := p.fails - restartAfterFailures; n >= 0 {
		p.hold = min(minRestartHold<<min(n, 16), maxRestartHold)
		p.holdUntil = time.Now().Add(p.hold)
	}
}

// release gives an instance back after a call that answered err: kept if nil, closed otherwise
// (a failed instance is never reused) or when the pool is retired. A failed call does not
// count towards the hold; the start that replaces its instance is paced (see
// restartAfterFailures). A call that succeeds does not end the pacing: beside a busy good
// caller, a trapping caller's starts would not be paced.
func (p *pool) release(inst *instance, err error) {
	if err != nil {
		inst.close()
		inst = nil
		p.mu.Lock()
		p.replace = min(p.replace+1, cap(p.sem))
		p.mu.Unlock()
	}
	p.done(inst, true)
}

func (p *pool) done(inst *instance, held bool) {
	p.mu.Lock()
	if inst != nil {
		if p.retired {
			inst.close()
		} else {
			p.idle = append(p.idle, inst)
		}
	}
	if held {
		<-p.sem
	}
	p.users--
	last := p.retireDoneLocked()
	p.mu.Unlock()
	if last {
		p.h.releaseModule(p.mod)
	}
}

// warm starts one instance if none is idle, so that the first call does not pay for it.
func (p *pool) warm(ctx context.Context, project, plugin string) error {
	inst, err := p.acquire(ctx, project, plugin)
	if err != nil {
		return err
	}
	p.release(inst, nil)
	return nil
}

// retire closes the idle instances; the busy ones are closed as they come back, and the
// compiled module is released after the last.
func (p *pool) retire() {
	p.mu.Lock()
	p.retired = true
	for _, inst := range p.idle {
		inst.close()
	}
	p.idle = nil
	last := p.retireDoneLocked()
	p.mu.Unlock()
	if last {
		p.h.releaseModule(p.mod)
	}
}

// retireDoneLocked reports, once, that a retired pool has no user left.
func (p *pool) retireDoneLocked() bool {
	if p.retired && p.users == 0 && !p.released {
		p.released = true
		return true
	}
	return false
}
