package store

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
)

// TestCertStorage: certmagic's Storage semantics (values, folders by component, recursive and
// flat listings, Stat, Delete of a folder, the missing-key error) on every Redis back end.
func TestCertStorage(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			at := time.UnixMilli(1_780_000_000_123)
			c := New(b.New(t), WithClock(func() time.Time { return at })).CertStorage(0)

			if _, err := c.Load(ctx, "certificates/acme/a.com/a.com.crt"); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("Load of a missing key: %v, want fs.ErrNotExist", err)
			}
			if _, err := c.Stat(ctx, "certificates"); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("Stat of a missing key: %v, want fs.ErrNotExist", err)
			}
			if _, err := c.List(ctx, "certificates", true); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("List of a missing folder: %v, want fs.ErrNotExist", err)
			}
			if c.Exists(ctx, "certificates") {
				t.Fatal("Exists on an empty storage")
			}

			values := map[string][]byte{
				"certificates/acme/a.com/a.com.crt":   []byte("cert\x00a"),
				"certificates/acme/a.com/a.com.key":   []byte("key a"),
				"certificates/acme/b.com/b.com.crt":   []byte("cert b"),
				"certificates/acme-x/c.com/c.com.crt": []byte("a sibling whose name extends acme"),
				"certificates/acme0/d.com/d.com.crt":  []byte("a sibling just past acme/ in byte order"),
				"acme/ca/users/me/me.json":            []byte("{}"),
				"empty":                               {},
			}
			for k, v := range values {
				if err := c.Store(ctx, k, v); err != nil {
					t.Fatal(err)
				}
			}
			for k, v := range values {
				if got, err := c.Load(ctx, k); err != nil || !bytes.Equal(got, v) {
					t.Fatalf("Load %q: %q, %v; want %q", k, got, err, v)
				}
			}
			if err := c.Store(ctx, "certificates/acme/a.com/a.com.key", []byte("key a, renewed")); err != nil {
				t.Fatal(err)
			}
			if got, _ := c.Load(ctx, "certificates/acme/a.com/a.com.key"); string(got) != "key a, renewed" {
				t.Fatalf("Store did not replace the value: %q", got)
			}

			info, err := c.Stat(ctx, "certificates/acme/a.com/a.com.crt")
			if err != nil || info != (CertKeyInfo{Key: "certificates/acme/a.com/a.com.crt", Modified: at, Size: 6, IsTerminal: true}) {
				t.Fatalf("Stat of a value: %+v, %v", info, err)
			}
			if info, err := c.Stat(ctx, "empty"); err != nil || !info.IsTerminal || info.Size != 0 {
				t.Fatalf("Stat of an empty value: %+v, %v", info, err)
			}
			if info, err := c.Stat(ctx, "certificates/acme"); err != nil || info != (CertKeyInfo{Key: "certificates/acme"}) {
				t.Fatalf("Stat of a folder: %+v, %v", info, err)
			}
			for k, want := range map[string]bool{
				"certificates": true, "certificates/acme/a.com": true, "certificates/acme/a.com/a.com.crt": true,
				"certificates/ac": false, "certificates/acme/a": false, "certificates/acme/a.com/a.com.crt/x": false,
			} {
				if got := c.Exists(ctx, k); got != want {
					t.Errorf("Exists %q: %v, want %v", k, got, want)
				}
			}

			for _, l := range []struct {
				prefix    string
				recursive bool
				want      []string
			}{
				{"certificates", false, []string{"certificates/acme", "certificates/acme-x", "certificates/acme0"}},
				{"certificates/acme", false, []string{"certificates/acme/a.com", "certificates/acme/b.com"}},
				{"certificates/acme/a.com", false, []string{"certificates/acme/a.com/a.com.crt", "certificates/acme/a.com/a.com.key"}},
				{"certificates/acme", true, []string{
					"certificates/acme/a.com", "certificates/acme/a.com/a.com.crt", "certificates/acme/a.com/a.com.key",
					"certificates/acme/b.com", "certificates/acme/b.com/b.com.crt"}},
				{"", false, []string{"acme", "certificates", "empty"}},
				{"certificates/acme/b.com/b.com.crt", true, nil},
			} {
				got, err := c.List(ctx, l.prefix, l.recursive)
				if err != nil || !slices.Equal(got, l.want) {
					t.Errorf("List %q recursive=%v: %q, %v; want %q", l.prefix, l.recursive, got, err, l.want)
				}
			}

			if err := c.Delete(ctx, "certificates/acme"); err != nil {
				t.Fatal(err)
			}
			if c.Exists(ctx, "certificates/acme") || c.Exists(ctx, "certificates/acme/a.com/a.com.crt") {
				t.Fatal("Delete of a folder left something in it")
			}
			if got, err := c.List(ctx, "certificates", true); err != nil || !slices.Equal(got, []string{
				"certificates/acme-x", "certificates/acme-x/c.com", "certificates/acme-x/c.com/c.com.crt",
				"certificates/acme0", "certificates/acme0/d.com", "certificates/acme0/d.com/d.com.crt"}) {
				t.Fatalf("Delete of a folder touched its siblings: %q, %v", got, err)
			}
			if err := c.Delete(ctx, "certificates/acme"); err != nil {
				t.Fatalf("Delete of a missing key: %v", err)
			}
			if err := c.Delete(ctx, "empty"); err != nil || c.Exists(ctx, "empty") {
				t.Fatalf("Delete of a value: %v", err)
			}
		})
	}
}

// TestCertStorageBounds: a value over MaxCertValue and an empty key are refused, and nothing
// is stored for them.
func TestCertStorageBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := New(redistest.Server(t)).CertStorage(0)
	if err := c.Store(ctx, "big", make([]byte, MaxCertValue)); err != nil {
		t.Fatalf("a value of MaxCertValue: %v", err)
	}
	if err := c.Store(ctx, "bigger", make([]byte, MaxCertValue+1)); err == nil || c.Exists(ctx, "bigger") {
		t.Fatalf("a value over MaxCertValue: %v", err)
	}
	if err := c.Store(ctx, "", []byte("x")); err == nil {
		t.Fatal("an empty key was stored")
	}
	if err := c.Delete(ctx, ""); err == nil || !c.Exists(ctx, "big") {
		t.Fatalf("Delete of the empty key (everything): %v", err)
	}
}

// TestCertStorageLock: two storages on one Redis (two gateways) exclude each other; the holder
// keeps the lock past its lease by renewing it; a waiter gives up when its context ends; a
// release wakes the waiter; Unlock of a lock not held is an error.
func TestCertStorageLock(t *testing.T) {
	t.Parallel()
	addr := redistest.ServerAddr(t)
	const lease = time.Second
	open := func() *CertStorage {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { rdb.Close() })
		return New(rdb).CertStorage(lease)
	}
	a, b := open(), open()
	ctx := context.Background()

	if err := a.Lock(ctx, "issue_cert_a.com"); err != nil {
		t.Fatal(err)
	}
	// Three leases: without renewal the lock would have been free for two of them.
	wctx, cancel := context.WithTimeout(ctx, 3*lease)
	err := b.Lock(wctx, "issue_cert_a.com")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("b took a's lock while a held it: %v", err)
	}
	if err := b.Lock(ctx, "issue_cert_b.com"); err != nil {
		t.Fatalf("another name's lock: %v", err)
	}

	got := make(chan error, 1)
	go func() { got <- b.Lock(ctx, "issue_cert_a.com") }()
	if err := a.Unlock(ctx, "issue_cert_a.com"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter did not get the lock within 30 s of its release")
	}

	cctx, cancelWait := context.WithCancel(ctx)
	go func() { got <- a.Lock(cctx, "issue_cert_a.com") }()
	cancelWait()
	select {
	case err := <-got:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("a waiter whose context ended: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a waiter did not stop within 30 s of its context ending")
	}

	for _, name := range []string{"issue_cert_a.com", "issue_cert_b.com"} {
		if err := b.Unlock(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Unlock(ctx, "issue_cert_a.com"); err == nil {
		t.Fatal("Unlock of a lock not held answered nil")
	}
}

// TestCertStorageLockContention: goroutines of two storages take one lock in turns; no two are
// ever inside at once.
func TestCertStorageLockContention(t *testing.T) {
	t.Parallel()
	addr := redistest.ServerAddr(t)
	var storages []*CertStorage
	for range 2 {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { rdb.Close() })
		storages = append(storages, New(rdb).CertStorage(0))
	}
	ctx := context.Background()
	var inside, entries atomic.Int32
	var wg sync.WaitGroup
	for i := range 6 {
		c := storages[i%2]
		wg.Go(func() {
			for range 4 {
				if err := c.Lock(ctx, "issue_cert_x.com"); err != nil {
					t.Error(err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders inside at once", n)
				}
				entries.Add(1)
				time.Sleep(time.Millisecond) // hold it across a scheduling point
				inside.Add(-1)
				if err := c.Unlock(ctx, "issue_cert_x.com"); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if entries.Load() != 24 {
		t.Fatalf("%d entries, want 24", entries.Load())
	}
}

// TestCertStorageLockCrashedHolder: a holder that dies (its connection gone, nobody renewing)
// loses the lock one lease later, and another storage takes it.
func TestCertStorageLockCrashedHolder(t *testing.T) {
	t.Parallel()
	addr := redistest.ServerAddr(t)
	const lease = time.Second
	crashed := redis.NewClient(&redis.Options{Addr: addr})
	holder := New(crashed).CertStorage(lease)
	ctx := context.Background()
	if err := holder.Lock(ctx, "issue_cert_a.com"); err != nil {
		t.Fatal(err)
	}
	holder.mu.Lock()
	renewer := holder.held["issue_cert_a.com"]
	holder.mu.Unlock()
	crashed.Close() // the process is gone: no renewal, no Unlock
	crashedAt := time.Now()

	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	other := New(rdb).CertStorage(lease)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := other.Lock(wctx, "issue_cert_a.com"); err != nil {
		t.Fatalf("the lock of a crashed holder was never freed: %v", err)
	}
	// The holder renewed at a third of the lease at the latest before it died, so the lock
	// stayed its own for two thirds of a lease at least.
	if waited := time.Since(crashedAt); waited < lease/2 {
		t.Fatalf("taken %v after the holder died, before its lease of %v ran out", waited, lease)
	}
	if err := other.Unlock(ctx, "issue_cert_a.com"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-renewer.done: // the dead holder's renewer gave up after a lease without renewal
	case <-time.After(30 * time.Second):
		t.Fatal("the dead holder's renewer still runs")
	}
	if err := holder.Unlock(ctx, "issue_cert_a.com"); err == nil {
		t.Fatal("Unlock of a lost lock answered nil")
	}
}
