package quota

import (
	"context"
	"testing"
	"time"

	"wb/internal/redistest"
)

func TestRateLimiter(t *testing.T) {
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			l := NewRateLimiter(b.New(t))
			now := time.Unix(1_800_000_000, 0)
			l.now = func() time.Time { return now }
			ctx := context.Background()
			for i := 0; i < 5; i++ {
				if ok, _, err := l.Allow(ctx, "proj_a", 10, 5); !ok || err != nil {
					t.Fatalf("request %d of burst refused: %v", i, err)
				}
			}
			ok, wait, err := l.Allow(ctx, "proj_a", 10, 5)
			if ok || err != nil || wait != 100*time.Millisecond {
				t.Fatalf("6th: ok=%v wait=%s err=%v", ok, wait, err)
			}
			if ok, _, _ := l.Allow(ctx, "proj_b", 10, 5); !ok {
				t.Fatal("another project shares the bucket")
			}
			now = now.Add(250 * time.Millisecond) // 2.5 tokens back
			for i := 0; i < 2; i++ {
				if ok, _, _ := l.Allow(ctx, "proj_a", 10, 5); !ok {
					t.Fatalf("refill %d refused", i)
				}
			}
			if ok, _, _ := l.Allow(ctx, "proj_a", 10, 5); ok {
				t.Fatal("refilled more than the rate")
			}
			if ok, _, _ := l.Allow(ctx, "proj_c", 0, 5); ok {
				t.Fatal("rate 0 allowed")
			}
		})
	}
}
