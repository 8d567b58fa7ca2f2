package node

import (
	"context"
	"testing"
	"time"

	"wb/session"
)

// TestTakeWaitsOnlyForABootItCanHave: a claim waits for a boot in flight of its pool only
// while there is one per waiting claim, and stops waiting as soon as that boot fails (each
// case would otherwise wait out a minute's bootWait).
func TestTakeWaitsOnlyForABootItCanHave(t *testing.T) {
	c := session.SizeClasses()[0]
	res := session.Resources{VCPU: c.VCPU, MemoryMiB: c.MemoryMiB, DiskGiB: c.DiskGiB, SizeClass: c.Name}
	k := poolKey{"base", c.Name, ""}
	newPool := func(booting, waiting int) *warmPool {
		p := newWarmPool(&Node{})
		p.booting[k], p.waiting[k], p.bootTook[k] = booting, waiting, time.Minute
		return p
	}
	// land ends one boot of k as the pool's refill does: booting down, a guest ready if ok.
	land := func(p *warmPool, ok bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.booting[k]--
		if ok {
			p.ready[k] = append(p.ready[k], warmGuest{id: "wp-landed"})
		}
		close(p.landed)
		p.landed = make(chan struct{})
	}
	take := func(p *warmPool) (warmGuest, bool, time.Duration) {
		t0 := time.Now()
		g, ok := p.take(context.Background(), "base", res, "")
		return g, ok, time.Since(t0)
	}
	const quick = 30 * time.Second // far below the minute a wrong wait would take

	t.Run("no boot in flight", func(t *testing.T) {
		if _, ok, took := take(newPool(0, 0)); ok || took > quick {
			t.Fatalf("claimed %v after %v, want no guest at once", ok, took)
		}
	})
	t.Run("the boot in flight is another claim's", func(t *testing.T) {
		if _, ok, took := take(newPool(1, 1)); ok || took > quick {
			t.Fatalf("claimed %v after %v, want no guest at once", ok, took)
		}
	})
	t.Run("the boot lands", func(t *testing.T) {
		p := newPool(1, 0)
		time.AfterFunc(100*time.Millisecond, func() { land(p, true) })
		g, ok, took := take(p)
		if !ok || g.id != "wp-landed" || took > quick {
			t.Fatalf("claimed %q (%v) after %v, want the landed guest", g.id, ok, took)
		}
		if p.waiting[k] != 0 {
			t.Fatalf("%d claims still counted waiting", p.waiting[k])
		}
	})
	t.Run("the boot fails", func(t *testing.T) {
		p := newPool(1, 0)
		time.AfterFunc(100*time.Millisecond, func() { land(p, false) })
		if _, ok, took := take(p); ok || took > quick {
			t.Fatalf("claimed %v after %v, want no guest once the boot failed", ok, took)
		}
		if p.waiting[k] != 0 {
			t.Fatalf("%d claims still counted waiting", p.waiting[k])
		}
	})
	t.Run("the claim's context ends", func(t *testing.T) {
		p := newPool(1, 0)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		t0 := time.Now()
		if _, ok := p.take(ctx, "base", res, ""); ok || time.Since(t0) > quick {
			t.Fatalf("claimed %v after %v, want no guest once the context ended", ok, time.Since(t0))
		}
	})
}
