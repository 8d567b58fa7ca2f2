package redistest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
)

// TestBeforeOnce: the hook runs once, before the first matching command, and its error is
// that command's; later ones reach Redis.
func TestBeforeOnce(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	runs := 0
	away := errors.New("away")
	redistest.BeforeOnce(rdb, func(cmd redis.Cmder) bool { return cmd.Name() == "set" }, func() error {
		runs++
		return away
	})
	if err := rdb.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("a command it does not match: %v", err)
	}
	if err := rdb.Set(ctx, "k", "1", 0).Err(); !errors.Is(err, away) {
		t.Fatalf("the first match: %v, want the hook's error", err)
	}
	if err := rdb.Set(ctx, "k", "2", 0).Err(); err != nil {
		t.Fatalf("the second match: %v", err)
	}
	if v, err := rdb.Get(ctx, "k").Result(); err != nil || v != "2" || runs != 1 {
		t.Fatalf("k = %q (%v), the hook ran %d times; want 2, once", v, err, runs)
	}
}
