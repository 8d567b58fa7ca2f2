package store

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
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

// TestCreateRunOnce: of two attempts at one run id, the first creates the record and owns
// it; the second is told it exists and changes nothing. The owner is never part of the run
// as the API shows it.
func TestCreateRunOnce(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			first := &session.Run{ID: "run_1", Object: "run", State: session.RunQueued, Stdout: "first"}
			if created, err := s.CreateRun(ctx, "proj_r", first, "lease_a"); err != nil || !created {
				t.Fatalf("the first create: %v, %v; want created", created, err)
			}
			second := &session.Run{ID: "run_1", Object: "run", State: session.RunQueued, Stdout: "second"}
			if created, err := s.CreateRun(ctx, "proj_r", second, "lease_b"); err != nil || created {
				t.Fatalf("the second create: %v, %v; want not created", created, err)
			}
			got, owner, err := s.GetRunOwner(ctx, "proj_r", "run_1")
			if err != nil || got.Stdout != "first" || owner != "lease_a" {
				t.Fatalf("GetRunOwner: %+v, %q, %v; want the first attempt's run, owned by lease_a", got, owner, err)
			}
			raw, err := json.Marshal(got)
			if err != nil || strings.Contains(string(raw), "lease_a") {
				t.Fatalf("the run as the API shows it names its owner: %s", raw)
			}
		})
	}
}
