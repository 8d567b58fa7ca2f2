package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"wb/agent"
	"wb/session"
)

// warmPool keeps booted guests per (template, size class), ready to be claimed.
type warmPool struct {
	n     *Node
	mu    sync.Mutex
	ready map[poolKey][]string // guest ids with a healthy agent
	kicks chan struct{}
}

type poolKey struct{ template, size string }

func newWarmPool(n *Node) *warmPool {
	return &warmPool{n: n, ready: map[poolKey][]string{}, kicks: make(chan struct{}, 1)}
}

func classOf(name string) (session.SizeClass, bool) {
	i := slices.IndexFunc(session.SizeClasses(), func(c session.SizeClass) bool { return c.Name == name })
	if i < 0 {
		return session.SizeClass{}, false
	}
	return session.SizeClasses()[i], true
}

// take claims a warm guest of template whose size class is exactly res.
func (p *warmPool) take(template string, res session.Resources) (string, bool) {
	c, ok := classOf(res.SizeClass)
	if !ok || c.VCPU != res.VCPU || c.MemoryMiB != res.MemoryMiB || c.DiskGiB != res.DiskGiB {
		return "", false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := poolKey{template, res.SizeClass}
	ids := p.ready[k]
	if len(ids) == 0 {
		return "", false
	}
	id := ids[0]
	p.ready[k] = ids[1:]
	p.kick()
	return id, true
}

// kick asks the pool to refill; it never blocks.
func (p *warmPool) kick() {
	select {
	case p.kicks <- struct{}{}:
	default:
	}
}

func (p *warmPool) usage() (vcpu, mem int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, ids := range p.ready {
		c, _ := classOf(k.size)
		vcpu += c.VCPU * len(ids)
		mem += c.MemoryMiB * len(ids)
	}
	return vcpu, mem
}

// run refills the pools on every kick and every few seconds, one guest at a time.
func (p *warmPool) run(ctx context.Context) {
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

func (p *warmPool) refill(ctx context.Context) {
	for _, want := range p.n.Pools {
		for ctx.Err() == nil {
			k := poolKey{want.Template, want.SizeClass}
			p.mu.Lock()
			have := len(p.ready[k])
			p.mu.Unlock()
			if have >= want.Size {
				break
			}
			id, err := p.boot(ctx, want)
			if err != nil {
				if ctx.Err() == nil {
					p.n.Logger.Error("node: warm pool", "template", want.Template, "size", want.SizeClass, "err", err)
				}
				break
			}
			p.mu.Lock()
			p.ready[k] = append(p.ready[k], id)
			p.mu.Unlock()
		}
	}
}

func (p *warmPool) boot(ctx context.Context, want Pool) (string, error) {
	tpl, err := p.n.template(want.Template)
	if err != nil {
		return "", err
	}
	c, _ := classOf(want.SizeClass)
	id := randomID("wp-")
	spec := p.n.spec(id, tpl, session.Resources{VCPU: c.VCPU, MemoryMiB: c.MemoryMiB, DiskGiB: c.DiskGiB, SizeClass: c.Name})
	cleanup := func() {
		bg := context.WithoutCancel(ctx)
		_ = p.n.Driver.Stop(bg, id)
		_ = p.n.Driver.Delete(bg, id)
		_ = removeAll(p.n.guestDir(id))
	}
	if err := p.n.Driver.Create(ctx, spec); err != nil {
		cleanup()
		return "", err
	}
	if err := p.n.Driver.Boot(ctx, id); err != nil {
		cleanup()
		return "", err
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c2 := p.n.agentFor(id)
	defer c2.Close()
	if err := waitHealthy(hctx, c2); err != nil {
		cleanup()
		return "", err
	}
	if want.Warm != nil {
		wctx, cancel := context.WithTimeout(ctx, warmUpTimeout)
		defer cancel()
		if err := want.Warm(wctx, agentExecer{c2}); err != nil {
			cleanup()
			return "", fmt.Errorf("warm-up: %w", err)
		}
	}
	return id, nil
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
	p.ready = map[poolKey][]string{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, ids := range all {
		for _, id := range ids {
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
			_ = n.journal.remove(sid)
			n.mu.Lock()
			delete(n.guests, sid)
			n.mu.Unlock()
		}()
	}
	wg.Wait()
}
