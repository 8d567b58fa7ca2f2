package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"wb/internal/redistest"
)

// TestSignals: a signal reaches one consumer of a group, a blocking read wakes on a signal
// sent while it waits, an unacknowledged signal is read again by its consumer, and an
// acknowledged one is gone.
func TestSignals(t *testing.T) {
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			s := New(b.New(t))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			// Nothing waiting: a read with no wait answers nothing at once.
			got, err := s.Signals(ctx, WorkOutbox, "g", "c1", 0, 10)
			if err != nil || len(got) != 0 {
				t.Fatalf("empty: %v %v", got, err)
			}
			// A blocking read wakes on a signal sent while it waits.
			done := make(chan []Signal, 1)
			go func() {
				got, err := s.Signals(ctx, WorkOutbox, "g", "c1", 20*time.Second, 10)
				if err != nil {
					t.Error(err)
				}
				done <- got
			}()
			time.Sleep(100 * time.Millisecond) // let the read block; a signal before it is read just as well
			if err := s.Signal(ctx, WorkOutbox, "proj_a"); err != nil {
				t.Fatal(err)
			}
			select {
			case got = <-done:
			case <-ctx.Done():
				t.Fatal("the blocking read did not wake")
			}
			if len(got) != 1 || got[0].Project != "proj_a" {
				t.Fatalf("woken with %v", got)
			}
			// Other kinds of work have their own stream.
			if other, err := s.Signals(ctx, WorkUsage, "g", "c1", 0, 10); err != nil || len(other) != 0 {
				t.Fatalf("usage signals: %v %v", other, err)
			}
			// Unacknowledged: the same consumer reads it again (it restarted mid-work).
			again, err := s.Signals(ctx, WorkOutbox, "g", "c1", 0, 10)
			if err != nil || len(again) != 1 || again[0].ID != got[0].ID {
				t.Fatalf("unacknowledged signal read again: %v %v", again, err)
			}
			if err := s.AckSignals(ctx, WorkOutbox, "g", again); err != nil {
				t.Fatal(err)
			}
			if after, err := s.Signals(ctx, WorkOutbox, "g", "c1", 0, 10); err != nil || len(after) != 0 {
				t.Fatalf("after ack: %v %v", after, err)
			}
			// A burst of one project is one project to handle.
			for _, p := range []string{"proj_b", "proj_c", "proj_b", "proj_b"} {
				if err := s.Signal(ctx, WorkPending, p); err != nil {
					t.Fatal(err)
				}
			}
			burst, err := s.Signals(ctx, WorkPending, "g", "c2", 0, 10)
			if err != nil || len(burst) != 4 {
				t.Fatalf("burst: %v %v", burst, err)
			}
			if ps := SignalProjects(burst); !slices.Equal(ps, []string{"proj_b", "proj_c"}) {
				t.Fatalf("projects of the burst: %v", ps)
			}
		})
	}
}
