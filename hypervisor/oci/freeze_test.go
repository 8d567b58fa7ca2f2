package oci

import (
	"context"
	"errors"
	"testing"
)

// TestRetryFreeze: a pause that failed with runc's "unable to freeze" is tried again, up to
// freezeAttempts times; any other failure is returned at once.
func TestRetryFreeze(t *testing.T) {
	frozenAfter := func(fails int, msg string) (func() error, *int) {
		calls := 0
		return func() error {
			calls++
			if calls <= fails {
				return errors.New(msg)
			}
			return nil
		}, &calls
	}
	busy := `exit status 1: time="2026-11-30T10:00:00Z" level=error msg="unable to freeze"`
	ctx := context.Background()

	pause, calls := frozenAfter(2, busy)
	if err := retryFreeze(ctx, pause); err != nil || *calls != 3 {
		t.Fatalf("two busy freezes then one that works: err %v after %d calls; want nil after 3", err, *calls)
	}
	pause, calls = frozenAfter(freezeAttempts, busy)
	if err := retryFreeze(ctx, pause); err == nil || *calls != freezeAttempts {
		t.Fatalf("always busy: err %v after %d calls; want the error after %d", err, *calls, freezeAttempts)
	}
	pause, calls = frozenAfter(1, "container not running")
	if err := retryFreeze(ctx, pause); err == nil || *calls != 1 {
		t.Fatalf("another failure: err %v after %d calls; want it at once", err, *calls)
	}
}
