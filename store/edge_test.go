package store

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestEdgeSecret: concurrent first readers (a gateway and a node starting together) all get
// one secret, and a later reader gets the same one.
func TestEdgeSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	s := New(rdb)
	got := make([][]byte, 8)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			b, err := s.EdgeSecret(ctx)
			if err != nil {
				t.Error(err)
			}
			got[i] = b
		})
	}
	wg.Wait()
	for i, b := range got {
		if len(b) != edgeSecretLen || !bytes.Equal(b, got[0]) {
			t.Fatalf("reader %d got %x, reader 0 %x", i, b, got[0])
		}
	}
	again, err := s.EdgeSecret(ctx)
	if err != nil || !bytes.Equal(again, got[0]) {
		t.Fatalf("a later read: %x, %v", again, err)
	}
	mr.Set(edgeSecretKey, "short")
	if _, err := s.EdgeSecret(ctx); err == nil {
		t.Fatal("a 5-byte secret was used")
	}
}
