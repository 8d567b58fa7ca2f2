package store

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestLockPlacement: one placer holds a project's placement at a time; a placer turned away
// gets the holder to place another round; a lock whose holder died expires with its lease.
func TestLockPlacement(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	s := New(rdb)

	a, err := s.LockPlacement(ctx, "proj_x")
	if err != nil || a == nil {
		t.Fatalf("first lock: %v, %v", a, err)
	}
	if other, err := s.LockPlacement(ctx, "proj_y"); err != nil || other == nil {
		t.Fatalf("another project's lock: %v, %v", other, err)
	}
	b, err := s.LockPlacement(ctx, "proj_x")
	if err != nil || b != nil {
		t.Fatalf("second lock while held: %v, %v", b, err)
	}
	if again, err := a.Done(ctx); err != nil || !again {
		t.Fatalf("holder after a turned-away placer: again=%v, %v; want another round", again, err)
	}
	if b, _ := s.LockPlacement(ctx, "proj_x"); b != nil {
		t.Fatal("the lock was released although another round was due")
	}
	// That refusal asked for a round again; the holder places it, then the lock is free.
	if again, _ := a.Done(ctx); !again {
		t.Fatal("the second request for a round was lost")
	}
	if again, err := a.Done(ctx); err != nil || again {
		t.Fatalf("quiet round: again=%v, %v", again, err)
	}
	c, err := s.LockPlacement(ctx, "proj_x")
	if err != nil || c == nil {
		t.Fatalf("lock after release: %v, %v", c, err)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A holder that died: the lease runs out, and its late Done is told it lost the lock.
	d, _ := s.LockPlacement(ctx, "proj_x")
	mr.FastForward(PlacementLease + time.Second)
	if e, _ := s.LockPlacement(ctx, "proj_x"); e == nil {
		t.Fatal("an expired lock still held")
	}
	if _, err := d.Done(ctx); err == nil {
		t.Fatal("a lost lock's Done answered no error")
	}
}
