package store

import (
	"context"
	"testing"
	"time"

	"wb/internal/redistest"
)

// TestTailSignals: a tail started from now hears only later signals, in order, whatever a
// consumer group does with them, and a transition signals its project.
func TestTailSignals(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			s := New(b.New(t))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := s.Signal(ctx, WorkOutbox, "proj_before"); err != nil {
				t.Fatal(err)
			}
			got, after, err := s.TailSignals(ctx, WorkOutbox, "", 0, 10)
			if err != nil || len(got) != 0 || after == "" {
				t.Fatalf("from now: %v %q %v; want nothing and a position", got, after, err)
			}
			// A blocking tail wakes on a signal sent while it waits.
			type read struct {
				sigs []Signal
				next string
			}
			done := make(chan read, 1)
			go func() {
				sigs, next, err := s.TailSignals(ctx, WorkOutbox, after, 20*time.Second, 10)
				if err != nil {
					t.Error(err)
				}
				done <- read{sigs, next}
			}()
			if err := s.Signal(ctx, WorkOutbox, "proj_a"); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if len(r.sigs) != 1 || r.sigs[0].Project != "proj_a" || r.next == after {
				t.Fatalf("woke with %+v next %q; want proj_a and a new position", r.sigs, r.next)
			}
			// A consumer group reading the same stream takes nothing from the tail.
			if _, err := s.Signals(ctx, WorkOutbox, "g", "c", 0, 10); err != nil {
				t.Fatal(err)
			}
			if err := s.Signal(ctx, WorkOutbox, "proj_b"); err != nil {
				t.Fatal(err)
			}
			got, next, err := s.TailSignals(ctx, WorkOutbox, r.next, 0, 10)
			if err != nil || len(got) != 1 || got[0].Project != "proj_b" {
				t.Fatalf("after the group read: %+v %v; want proj_b", got, err)
			}
			got, again, err := s.TailSignals(ctx, WorkOutbox, next, 0, 10)
			if err != nil || len(got) != 0 || again != next {
				t.Fatalf("nothing new: %+v %q %v; want nothing at %q", got, again, err, next)
			}
		})
	}
}
