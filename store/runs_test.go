package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
)

// TestRunExpires: a run is readable under its own key, to which each write gives the store's
// retention as TTL (Redis drops it, output and all, past that), on every backend.
func TestRunExpires(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t), WithRetention(time.Hour))
			run := &session.Run{ID: "run_1", Object: "run", State: session.RunQueued}
			if err := s.PutRun(ctx, "proj_r", run); err != nil {
				t.Fatal(err)
			}
			run.State, run.Stdout = session.RunSucceeded, "out"
			if err := s.PutRun(ctx, "proj_r", run); err != nil {
				t.Fatal(err)
			}
			got, err := s.GetRun(ctx, "proj_r", "run_1")
			if err != nil || got.State != session.RunSucceeded || got.Stdout != "out" {
				t.Fatalf("GetRun: %+v, %v; want the run as last written", got, err)
			}
			key := ProjectKeys("proj_r").run("run_1")
			if ttl, err := s.rdb.TTL(ctx, key).Result(); err != nil || ttl <= 59*time.Minute || ttl > time.Hour {
				t.Fatalf("TTL of %s: %v, %v; want the retention (1h)", key, ttl, err)
			}
			if _, err := s.GetRun(ctx, "proj_other", "run_1"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("another project's run: %v, want ErrNotFound", err)
			}
		})
	}
}
