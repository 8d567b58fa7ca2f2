package plugins

import (
	"context"
	"errors"
	"sync"
)

// errRetired answers an acquire on a pool whose version was replaced and whose compiled module
// is gone: the caller takes the current plugin set again.
var errRetired = errors.New("plugin version retired")

// pool bounds the instances of one (project, digest, memory limit): at most size calls hold
// one at a time (sem); the idle ones are kept most recently used first, so that a steady trickle
// of calls runs on one warm instance.
type pool struct {
	h   *Host
	mod *module
	sem chan struct{}

	mu       sync.Mutex
	idle     []*instance
	retired  bool // replaced: instances are closed as they come back
	users    int  // acquired and not yet released
	released bool // the module reference was given back
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
		var err error
		if inst, err = p.h.newInstance(ctx, p.mod, project, plugin); err != nil {
			p.done(nil, true)
			return nil, err
		}
	}
	return inst, nil
}

// release gives an instance back: kept if healthy, closed otherwise (a failed instance is
// never reused) or when the pool is retired.
func (p *pool) release(inst *instance, healthy bool) {
	if !healthy {
		inst.close()
		inst = nil
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
	p.release(inst, true)
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
