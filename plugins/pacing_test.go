package plugins

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/session"
)

// slowStarts makes each start of the project's plugin (a parityTrapPlugin) take d, inside its
// _initialize, and answers a count of the starts.
func slowStarts(sink *logSink, project, plugin string, d time.Duration) func() int {
	line := "started project=" + project + " plugin=" + plugin
	sink.mu.Lock()
	sink.onLine = func(l string) {
		if l == line {
			time.Sleep(d)
		}
	}
	sink.mu.Unlock()
	return func() int { return strings.Count(sink.text(), line) }
}

// TestCheckAfterARareTrapIsEvaluated: after a call that traps, the next caller of a plugin
// whose start takes well under a second, and which has not failed for a while, is evaluated
// within a runtime check's 2 s: its start is not paced. (It waited 9 times the last start
// first, 2.7 s for a start of 300 ms, and the check failed closed.)
func TestCheckAfterARareTrapIsEvaluated(t *testing.T) {
	const startTakes = 300 * time.Millisecond
	h, sink := newTestHost(t, mini(t), Options{})
	const project = "proj-rare-trap"
	slowStarts(sink, project, "parity", startTakes)
	mustPut(t, h, project, "parity", parityTrapPlugin(`{"allow":false,"reasons":["evaluated"]}`), 0, false)
	odd, even := parityInputs(t)
	if d := one(t, decide(t, h, project, odd)); d.Allow || !strings.HasSuffix(d.Reasons[0], "trapped: unreachable") {
		t.Fatalf("a call that traps: %+v", d)
	}
	// A call bounded like node/runtime.go's check.
	ctx, cancel := context.WithTimeout(ctxT(t), 2*time.Second)
	defer cancel()
	start := time.Now()
	ds, err := h.Decide(ctx, project, session.PointAdmission, even)
	if err != nil {
		t.Fatalf("a 2 s call after one trap: %v after %v, want it evaluated", err, time.Since(start).Round(time.Millisecond))
	}
	if d := one(t, ds); d.Allow || len(d.Reasons) != 1 || d.Reasons[0] != "evaluated" {
		t.Fatalf("a 2 s call after one trap: %+v, want it evaluated (a deny, \"evaluated\")", d)
	}
	t.Logf("evaluated in %v", time.Since(start).Round(time.Millisecond))
}

// TestStartsAfterTrapsArePacedBesideGoodCalls: a caller whose calls all trap, beside one whose
// calls all succeed, has its restarts paced like a caller trapping alone: a second of it costs
// about a tenth in starts. (A success reset the pacing, so the trapping caller's every start
// was unpaced beside a busy good caller: more than half its time.)
func TestStartsAfterTrapsArePacedBesideGoodCalls(t *testing.T) {
	const startTakes = 40 * time.Millisecond
	h, sink := newTestHost(t, mini(t), Options{})
	const project = "proj-paced-beside"
	starts := slowStarts(sink, project, "parity", startTakes)
	mustPut(t, h, project, "parity", parityTrapPlugin(`{"allow":true}`), 0, true)
	odd, even := parityInputs(t)
	before := starts()
	began := time.Now()
	end := began.Add(time.Second)
	var wg sync.WaitGroup
	for _, in := range [][]byte{odd, even} {
		wg.Go(func() {
			for time.Now().Before(end) {
				if _, err := h.Decide(context.Background(), project, session.PointAdmission, in); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	n, took := starts()-before, time.Since(began)
	t.Logf("%d starts in %v", n, took.Round(time.Millisecond))
	if share := float64(time.Duration(n)*startTakes) / float64(took); share > 0.25 {
		t.Errorf("a caller trapping beside a good one: %d starts of %s each in %s, %.0f%% of the time, want at most 25%%", n, startTakes, took.Round(time.Millisecond), 100*share)
	}
}
