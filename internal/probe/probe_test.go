package probe

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestUntilBounds: a probe that runs out of time is given twice as long the next time, up
// to the cap; one that fails at once keeps its bound; the first answer ends the wait.
func TestUntilBounds(t *testing.T) {
	b := Bounds{First: 20 * time.Millisecond, Max: 160 * time.Millisecond}
	var bounds []time.Duration
	err := b.Until(context.Background(), nil, func(ctx context.Context) error {
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatal("a probe without a bound")
		}
		bounds = append(bounds, time.Until(dl))
		switch n := len(bounds); {
		case n == 2:
			return errors.New("refused") // at once: no longer bound next time
		case n < 7:
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{20, 40, 40, 80, 160, 160, 160}
	if len(bounds) != len(want) {
		t.Fatalf("%d probes, want %d: %v", len(bounds), len(want), bounds)
	}
	for i, w := range want {
		w *= time.Millisecond
		if bounds[i] > w || bounds[i] < w-15*time.Millisecond {
			t.Errorf("probe %d was bound to %s, want %s: %v", i+1, bounds[i], w, bounds)
		}
	}
}

// TestUntilEnds: the wait ends with ctx, saying what the last probe answered, or when what
// it waits for is gone.
func TestUntilEnds(t *testing.T) {
	refused := errors.New("connection refused")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := Default().Until(ctx, nil, func(context.Context) error { return refused })
	if !errors.Is(err, context.DeadlineExceeded) || err.Error() != "context deadline exceeded (last probe: connection refused)" {
		t.Errorf("at ctx's end: %v", err)
	}
	gone := make(chan struct{})
	close(gone)
	if err := Default().Until(context.Background(), gone, func(context.Context) error { return refused }); !errors.Is(err, ErrGone) {
		t.Errorf("once gone: %v", err)
	}
}
