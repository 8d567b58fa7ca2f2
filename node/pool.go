package node

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"wb/agent"
	"wb/session"
)

// warmPool keeps booted guests per (template, size class, runner), ready to be claimed.
//
// A pool holds at least its Size; a runner pool (Pool.Max above Size) grows with the rate of
// claims asked of it over the last rateWindow: what that rate claims during one boot, twice
// over (see target), up to Max and within the node's free capacity. Each run destroys its
// guest, so runs/s beyond a burst the pool absorbs are bounded by the refill rate: at most
// PoolParallel boots at a time, each taking bootTook (a create, boot and agent probe, plus
// the runner's start), so the refill limit is PoolParallel / bootTook guests a second, and
// below it the host's CPU: every run pays for a whole guest's life. Where that goes, for a
// tier-1 python3 run on runc (4 clients on a 2-core host, perf record of the whole host, about
// 110-150 ms of CPU a run): the runtime's own processes (`runc run --detach`, `runc delete`)
// and its init about a third; wb itself (the API, the node, the guest's disk image copied
// and loop-mounted, its bundle and journal) about a fifth; python3's start in the guest, the guest's
// agent, Redis and the kernel's work for each the rest. On runsc (ptrace platform here) the
// sandbox running the agent's and python3's start is two thirds of about 400 ms a run.
type warmPool struct {
	n        *Node
	mu       sync.Mutex
	ready    map[poolKey][]warmGuest // guests with a healthy agent
	booting  map[poolKey]int
	demand   map[poolKey][]time.Time   // claims asked of the key (served or not) within rateWindow
	bootTook map[poolKey]time.Duration // moving average of a boot
	backoff  map[poolKey]time.Time     // no boots of the key before, after one failed
	waiting  map[poolKey]int           // claims waiting for a boot of the key in flight
	landed   chan struct{}             // closed (and replaced) as each boot ends
	kicks    chan struct{}
	slots    chan struct{} // one per boot in flight
	wg       sync.WaitGroup
}

type poolKey struct{ template, size, runner string }

// warmGuest is a ready guest and the agent client its boot probed it with: the session
// keeps that client's open connection (and a claim that must probe the agent, see
// warmAlive, uses it) instead of dialling the agent again (a new connection into a gVisor
// guest costs an accept in the sandbox, a few ms on a loaded host).
type warmGuest struct {
	id     string
	agent  *agent.Client
	direct *agent.DirectGuest // a direct guest's, in place of agent (see bootDirect)
}

// close lets go of the guest's agent client or direct streams.
func (g warmGuest) close() {
	if g.agent != nil {
		g.agent.Close()
	}
	if g.direct != nil {
		g.direct.Close()
	}
}

func (w Pool) key() poolKey { return poolKey{w.Template, w.SizeClass, w.Runner} }

const (
	// rateWindow is how far back the claim rate that sizes a runner pool looks.
	rateWindow = 10 * time.Second
	// failBackoff is how long a pool whose boot failed waits before it boots again.
	failBackoff = 2 * time.Second
	// firstBootWait bounds a claim's wait for a pool's first boot (see take), whose time is
	// not known yet: a cold start takes about as long.
	firstBootWait = 5 * time.Second
)

func newWarmPool(n *Node) *warmPool {
	par := n.PoolParallel
	if par <= 0 {
		par = max(1, runtime.NumCPU())
	}
	return &warmPool{n: n, ready: map[poolKey][]warmGuest{}, booting: map[poolKey]int{}, demand: map[poolKey][]time.Time{},
		bootTook: map[poolKey]time.Duration{}, backoff: map[poolKey]time.Time{}, waiting: map[poolKey]int{}, landed: make(chan struct{}),
		kicks: make(chan struct{}, 1), slots: make(chan struct{}, par)}
}

func classOf(name string) (session.SizeClass, bool) {
	i := slices.IndexFunc(session.SizeClasses(), func(c session.SizeClass) bool { return c.Name == name })
	if i < 0 {
		return session.SizeClass{}, false
	}
	return session.SizeClasses()[i], true
}

// take claims a warm guest of template whose size class is exactly res: one whose runner
// (runtime) waits when runner is set and the pool has one, else a plain one. A claim that
// found no guest kicks the refill at once; one that found a guest leaves the kick to its
// caller, once the claim is served (see Provision): the refill's boot (a runtime start, a
// disk image, a sandbox start) would otherwise take the CPU from the claim on a small host.
//
// A claim that finds none ready while a boot of its pool is in flight that no other claim
// waits for waits for that boot, up to one boot's time (bootWait), rather than start its own
// guest cold: the boot in flight started earlier, so it is ready sooner, and on a small host
// a cold start beside it would take CPU from both.
func (p *warmPool) take(ctx context.Context, template string, res session.Resources, runner string) (warmGuest, bool) {
	c, ok := classOf(res.SizeClass)
	if !ok || c.VCPU != res.VCPU || c.MemoryMiB != res.MemoryMiB || c.DiskGiB != res.DiskGiB {
		return warmGuest{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := []poolKey{{template, res.SizeClass, runner}}
	if runner != "" {
		keys = append(keys, poolKey{template, res.SizeClass, ""})
	}
	own := keys[0]
	p.noteDemand(own, time.Now())
	var deadline time.Time
	for {
		for _, k := range keys {
			if gs := p.ready[k]; len(gs) > 0 {
				p.ready[k] = gs[1:]
				return gs[0], true
			}
		}
		if deadline.IsZero() {
			p.kick() // the pool may have to grow or refill
			if p.booting[own] <= p.waiting[own] {
				return warmGuest{}, false
			}
			deadline = time.Now().Add(p.bootWait(own))
			p.waiting[own]++
			defer func() { p.waiting[own]-- }() // runs before the deferred Unlock
		} else if p.booting[own] < p.waiting[own] || !time.Now().Before(deadline) || ctx.Err() != nil {
			return warmGuest{}, false // the boot failed, or took too long
		}
		landed := p.landed
		p.mu.Unlock()
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-landed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		p.mu.Lock()
	}
}

// bootWait is how long a claim waits for a boot in flight: the pool's average boot, or
// firstBootWait before the pool has one. The caller holds p.mu.
func (p *warmPool) bootWait(k poolKey) time.Duration {
	if took := p.bootTook[k]; took > 0 {
		return took
	}
	return firstBootWait
}

// noteDemand records a claim asked of k. The caller holds p.mu.
func (p *warmPool) noteDemand(k poolKey, now time.Time) {
	d := p.demand[k]
	i := 0
	for i < len(d) && now.Sub(d[i]) > rateWindow {
		i++
	}
	d = append(d[i:], now)
	if len(d) > 4096 { // a bound; a rate this high sizes the pool at Max anyway
		d = d[len(d)-4096:]
	}
	p.demand[k] = d
}

// target is how many guests pool w should hold (ready or booting) now. The caller holds p.mu.
func (p *warmPool) target(w Pool, now time.Time) int {
	most := max(w.Max, w.Size)
	if most == w.Size {
		return w.Size
	}
	k := w.key()
	n := 0
	for _, t := range p.demand[k] {
		if now.Sub(t) <= rateWindow {
			n++
		}
	}
	if n == 0 {
		return w.Size
	}
	took := p.bootTook[k]
	if took == 0 {
		took = time.Second
	}
	// A claimed guest is replaced one boot later: the claims of a boot's time must find one
	// ready, twice over for bursts.
	rate := float64(n) / rateWindow.Seconds()
	need := int(math.Ceil(2 * rate * took.Seconds()))
	return min(most, max(w.Size, need))
}

// kick asks the pool to refill; it never blocks.
func (p *warmPool) kick() {
	select {
	case p.kicks <- struct{}{}:
	default:
	}
}

// usage is what the pool's guests hold, those booting included.
func (p *warmPool) usage() (vcpu, mem int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.usageLocked()
}

func (p *warmPool) usageLocked() (vcpu, mem int) {
	for k, ids := range p.ready {
		c, _ := classOf(k.size)
		vcpu += c.VCPU * len(ids)
		mem += c.MemoryMiB * len(ids)
	}
	for k, n := range p.booting {
		c, _ := classOf(k.size)
		vcpu += c.VCPU * n
		mem += c.MemoryMiB * n
	}
	return vcpu, mem
}

// run refills the pools on every kick and every few seconds, PoolParallel boots at a time.
func (p *warmPool) run(ctx context.Context) {
	defer p.wg.Wait()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	p.kick()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kicks:
		case <-tick.C:
		}
		p.refill(ctx)
	}
}

// refill starts boots while a pool is short and a slot is free; each boot kicks the pool
// again as it ends.
func (p *warmPool) refill(ctx context.Context) {
	for ctx.Err() == nil {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		want, ok := p.next(time.Now())
		if !ok {
			<-p.slots
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-p.slots; p.kick() }()
			k := want.key()
			t0 := time.Now()
			g, err := p.boot(ctx, want)
			took := time.Since(t0)
			p.mu.Lock()
			p.booting[k]--
			if err == nil {
				p.ready[k] = append(p.ready[k], g)
				if old := p.bootTook[k]; old > 0 {
					took = (3*old + took) / 4
				}
				p.bootTook[k] = took
			} else {
				p.backoff[k] = time.Now().Add(failBackoff)
			}
			close(p.landed) // wakes the claims waiting for a boot (see take)
			p.landed = make(chan struct{})
			p.mu.Unlock()
			if err == nil {
				p.n.Logger.Debug("node: warm pool: guest ready", "template", want.Template, "size", want.SizeClass, "runner", want.Runner, "guest", g.id, "took", time.Since(t0))
			}
			if err != nil && ctx.Err() == nil {
				p.n.Logger.Error("node: warm pool", "template", want.Template, "size", want.SizeClass, "runner", want.Runner, "err", err)
			}
		}()
	}
}

// next picks the pool to boot a guest for, and counts it booting: the one furthest below its
// target. A pool grows beyond its Size only into the node's free capacity.
func (p *warmPool) next(now time.Time) (Pool, bool) {
	usedV, usedM := p.n.sessionUsage()
	p.mu.Lock()
	defer p.mu.Unlock()
	pv, pm := p.usageLocked()
	freeV, freeM := p.n.Info.VCPU-usedV-pv, p.n.Info.MemoryMiB-usedM-pm
	best, short := -1, 0
	for i, w := range p.n.Pools {
		k := w.key()
		if now.Before(p.backoff[k]) {
			continue
		}
		have := len(p.ready[k]) + p.booting[k]
		gap := p.target(w, now) - have
		if gap <= 0 {
			continue
		}
		c, _ := classOf(w.SizeClass)
		if have >= w.Size && (c.VCPU > freeV || c.MemoryMiB > freeM) {
			continue
		}
		if gap > short {
			best, short = i, gap
		}
	}
	if best < 0 {
		return Pool{}, false
	}
	w := p.n.Pools[best]
	p.booting[w.key()]++
	return w, true
}

func (p *warmPool) boot(ctx context.Context, want Pool) (_ warmGuest, err error) {
	tpl, err := p.n.template(want.Template)
	if err != nil {
		return warmGuest{}, err
	}
	c, _ := classOf(want.SizeClass)
	id := randomID("wp-")
	spec := p.n.spec(id, tpl, session.Resources{VCPU: c.VCPU, MemoryMiB: c.MemoryMiB, DiskGiB: c.DiskGiB, SizeClass: c.Name})
	if dl, ok := p.n.directLauncher(); ok && want.Runner != "" && want.Warm == nil {
		if dspec, ok := directSpec(spec, tpl, want.Runner, p.n.Driver); ok {
			return p.bootDirect(ctx, dl, dspec)
		}
	}
	cleanup := func() {
		bg := context.WithoutCancel(ctx)
		_ = p.n.Driver.Stop(bg, id)
		_ = p.n.Driver.Delete(bg, id)
		_ = removeAll(p.n.guestDir(id))
	}
	if err := p.n.launch(ctx, spec); err != nil {
		cleanup()
		return warmGuest{}, err
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c2 := p.n.agentFor(id)
	defer func() {
		if err != nil {
			c2.Close()
		}
	}()
	if err := waitHealthy(hctx, c2); err != nil {
		cleanup()
		return warmGuest{}, err
	}
	if want.Warm != nil {
		wctx, cancel := context.WithTimeout(ctx, warmUpTimeout)
		defer cancel()
		if err := want.Warm(wctx, agentExecer{c2}); err != nil {
			cleanup()
			return warmGuest{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	if want.Runner != "" {
		// A runner that does not start leaves a plain warm guest: its runs start the
		// interpreter as usual (the agent finds no runner), slower but the same.
		req, ok := runnerRequest(tpl, want.Runner)
		if !ok {
			p.n.Logger.Warn("node: warm pool: no runner for this runtime here", "template", want.Template, "runner", want.Runner)
		} else if _, err := startRunner(ctx, c2, req); err != nil {
			p.n.Logger.Warn("node: warm pool: runner did not start; runs in this guest start their interpreter", "guest", id, "runner", want.Runner, "err", err)
		}
	}
	return warmGuest{id: id, agent: c2}, nil
}

func startRunner(ctx context.Context, c *agent.Client, req agent.RunnerRequest) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return c.StartRunner(ctx, req)
}

// warmUpTimeout bounds a pooled guest's warm-up (a desktop's browser starts in seconds; a
// loaded machine takes a minute).
const warmUpTimeout = 3 * time.Minute

// agentExecer runs a warm-up's commands through the guest's agent; each lasts as long as the
// warm-up's context allows.
type agentExecer struct{ c *agent.Client }

func (e agentExecer) Exec(ctx context.Context, argv []string, stdin []byte) ([]byte, []byte, int, error) {
	timeout := session.ExecTimeoutMaxS
	if d, ok := ctx.Deadline(); ok {
		timeout = min(max(1, int(time.Until(d)/time.Second)), session.ExecTimeoutMaxS)
	}
	res, err := e.c.Exec(ctx, agent.ExecRequest{Argv: argv, Stdin: stdin, TimeoutS: timeout}, nil)
	if err != nil {
		return nil, nil, 0, err
	}
	if res.TimedOut {
		return []byte(res.Stdout), []byte(res.Stderr), res.ExitCode, fmt.Errorf("%s did not finish within %ds", argv[0], timeout)
	}
	return []byte(res.Stdout), []byte(res.Stderr), res.ExitCode, nil
}

// drain destroys every warm guest, in parallel.
func (p *warmPool) drain(ctx context.Context) {
	p.mu.Lock()
	all := p.ready
	p.ready = map[poolKey][]warmGuest{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, gs := range all {
		for _, g := range gs {
			g.close()
			id := g.id
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = p.n.Driver.Stop(ctx, id)
				_ = p.n.Driver.Delete(ctx, id)
				_ = removeAll(p.n.guestDir(id))
			}()
		}
	}
	wg.Wait()
}

// DestroyAll removes every guest this node runs, sessions' and the warm pool's, and forgets
// them. `wb serve` calls it on exit when its Redis is embedded: the sessions' state dies with
// the process, so nothing could ever claim their guests again.
func (n *Node) DestroyAll(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n.pool.drain(ctx)
	}()
	for _, l := range n.all() {
		wg.Add(1)
		go func() { // in parallel: a runsc delete takes a second or two
			defer wg.Done()
			l.mu.Lock()
			n.kill(ctx, l)
			id, sid := l.g.GuestID, l.g.SessionID
			l.mu.Unlock()
			n.remove(ctx, id)
			n.forgetJournal(l, sid)
			n.mu.Lock()
			delete(n.guests, sid)
			n.mu.Unlock()
		}()
	}
	wg.Wait()
	n.removeCgroupParent()
}
