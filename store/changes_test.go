package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
)

// watcher records what one subscriber of Changes is handed.
type watcher struct {
	mu      sync.Mutex
	changes []ProjectChange
	lives   []bool
	live    chan struct{} // a value for each Live(true)
	hold    chan struct{} // when not nil, Changed waits for it to close
}

func startWatcher(t testing.TB, rdb redis.UniversalClient) *watcher {
	t.Helper()
	w := &watcher{live: make(chan struct{}, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewChanges(rdb, nil).Watch(ctx, ChangeWatch{
			Changed: func(c ProjectChange) {
				w.mu.Lock()
				hold := w.hold
				w.changes = append(w.changes, c)
				w.mu.Unlock()
				if hold != nil {
					<-hold
				}
			},
			Live: func(live bool) {
				w.mu.Lock()
				w.lives = append(w.lives, live)
				w.mu.Unlock()
				if live {
					w.live <- struct{}{}
				}
			},
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	w.waitLive(t)
	return w
}

func (w *watcher) waitLive(t testing.TB) {
	t.Helper()
	select {
	case <-w.live:
	case <-time.After(30 * time.Second):
		t.Fatal("the watcher never subscribed")
	}
}

func (w *watcher) got() ([]ProjectChange, []bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ProjectChange(nil), w.changes...), append([]bool(nil), w.lives...)
}

// TestChanges: on every back end (a Cluster uses sharded Pub/Sub), Publish reaches every
// subscriber and returns only once each has been handed the change and acknowledged it; with
// no subscriber it returns at once; a subscriber that does not answer is waited for a bounded
// time only.
func TestChanges(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.New(t)
			ctx := context.Background()
			c := NewChanges(rdb, nil)
			if told, acked := c.Publish(ctx, "proj_nobody", ChangePlan); told != 0 || acked != 0 {
				t.Fatalf("no subscriber: told %d, acked %d", told, acked)
			}
			w1, w2 := startWatcher(t, rdb), startWatcher(t, rdb)
			if told, acked := c.Publish(ctx, "proj_1", ChangePolicies); told != 2 || acked != 2 {
				t.Fatalf("told %d, acked %d; want 2, 2", told, acked)
			}
			for i, w := range []*watcher{w1, w2} {
				got, lives := w.got() // already: Publish waited for it
				if len(got) != 1 || got[0].Project != "proj_1" || got[0].Kind != ChangePolicies || got[0].ID == "" {
					t.Errorf("watcher %d was handed %+v", i+1, got)
				}
				if len(lives) != 1 || !lives[0] {
					t.Errorf("watcher %d was told live %v", i+1, lives)
				}
			}

			// A subscriber stuck in Changed: the writer stops waiting after its wait.
			w1.mu.Lock()
			w1.hold = make(chan struct{})
			w1.mu.Unlock()
			c.wait = 200 * time.Millisecond
			start := time.Now()
			told, acked := c.Publish(ctx, "proj_1", ChangeKeys)
			if told != 2 || acked != 1 {
				t.Errorf("with one stuck subscriber: told %d, acked %d; want 2, 1", told, acked)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("Publish waited %v for a stuck subscriber", d)
			}
			close(w1.hold)
		})
	}
}

// TestChangesResubscribe: a subscription that Redis closes is made again, and the subscriber
// is told it was lost (it must trust nothing it holds) and then that it holds again (it
// drops everything: what was published meanwhile is lost).
func TestChangesResubscribe(t *testing.T) {
	t.Parallel()
	rdb := redistest.Server(t)
	w := startWatcher(t, rdb)
	if err := rdb.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	w.waitLive(t)
	if _, lives := w.got(); len(lives) < 3 || lives[0] != true || lives[len(lives)-2] != false || lives[len(lives)-1] != true {
		t.Fatalf("told live %v, want true, (…,) false, true", lives)
	}
	if told, acked := NewChanges(rdb, nil).Publish(context.Background(), "proj_1", ChangePlan); told != 1 || acked != 1 {
		t.Fatalf("after the resubscription: told %d, acked %d", told, acked)
	}
}

// TestRevokeAPIKey: a key is revoked by its prefix, within its own project only.
func TestRevokeAPIKey(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			p, key, err := s.CreateProject(ctx, "revoke")
			if err != nil {
				t.Fatal(err)
			}
			q, other, err := s.CreateProject(ctx, "other")
			if err != nil {
				t.Fatal(err)
			}
			if len(KeyPrefix(key)) != 16 {
				t.Fatalf("prefix %q", KeyPrefix(key))
			}
			if err := s.RevokeAPIKey(ctx, q.ID, KeyPrefix(key)); !errors.Is(err, ErrNotFound) {
				t.Fatalf("another project revoked the key: %v", err)
			}
			if got, err := s.Authenticate(ctx, key); err != nil || got.ID != p.ID {
				t.Fatalf("Authenticate: %v, %v", got.ID, err)
			}
			if err := s.RevokeAPIKey(ctx, p.ID, KeyPrefix(key)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Authenticate(ctx, key); !errors.Is(err, ErrBadKey) {
				t.Fatalf("a revoked key authenticates: %v", err)
			}
			if err := s.RevokeAPIKey(ctx, p.ID, KeyPrefix(key)); !errors.Is(err, ErrNotFound) {
				t.Fatalf("revoked twice: %v", err)
			}
			if got, err := s.Authenticate(ctx, other); err != nil || got.ID != q.ID {
				t.Fatalf("the other project's key: %v, %v", got.ID, err)
			}
		})
	}
}

// TestRevokeAPIKeyMadeBeforeTheIndex: a key made before keys were indexed by prefix (only
// its wb:apikey:HEX) is not found by its prefix until it is used; its first authentication
// indexes it, and then its prefix revokes it.
func TestRevokeAPIKeyMadeBeforeTheIndex(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.New(t)
			s := New(rdb)
			p, _, err := s.CreateProject(ctx, "legacy")
			if err != nil {
				t.Fatal(err)
			}
			const legacy = "wb_live_madebeforetheindex0123456789ab"
			if err := rdb.Set(ctx, apiKeyHashKey(apiKeyHash(legacy)), p.ID, 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := s.RevokeAPIKey(ctx, p.ID, KeyPrefix(legacy)); !errors.Is(err, ErrNotFound) {
				t.Fatalf("an unindexed key was found by its prefix: %v", err)
			}
			if got, err := s.Authenticate(ctx, legacy); err != nil || got.ID != p.ID {
				t.Fatalf("Authenticate: %v, %v", got.ID, err)
			}
			if err := s.RevokeAPIKey(ctx, p.ID, KeyPrefix(legacy)); err != nil {
				t.Fatalf("revoke the key once used: %v", err)
			}
			if _, err := s.Authenticate(ctx, legacy); !errors.Is(err, ErrBadKey) {
				t.Fatalf("a revoked key authenticates: %v", err)
			}
		})
	}
}

// BenchmarkChangePublish: the cost a write adds to announce its change and wait for two
// gateways' acknowledgements (PUBLISH, then a BLPOP for each), against a local redis-server.
func BenchmarkChangePublish(b *testing.B) {
	rdb := redistest.Server(b)
	startWatcher(b, rdb)
	startWatcher(b, rdb)
	c := NewChanges(rdb, nil)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if told, acked := c.Publish(ctx, "proj_bench", ChangePlan); told != 2 || acked != 2 {
			b.Fatalf("told %d, acked %d", told, acked)
		}
	}
}
