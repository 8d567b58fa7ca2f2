package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBombWatch: a count that presses on the limit, dipping a little below it between samples
// as a real bomb's does, is ended after atLimitFor; a busy but legitimate workload is not.
func TestBombWatch(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	run := func(samples []int) (firedAt int) {
		w := bombWatch{max: 256}
		for i, cur := range samples {
			if w.observe(cur, t0.Add(time.Duration(i)*atLimitCheck)) {
				return i
			}
		}
		return -1
	}
	ticks := int(atLimitFor / atLimitCheck)
	bomb := make([]int, 3*ticks)
	for i := range bomb {
		bomb[i] = []int{256, 255, 253, 256, 250}[i%5] // at the limit, and just short of it
	}
	if got := run(bomb); got != ticks {
		t.Errorf("a bomb dipping below its limit between samples: fired at sample %d, want %d", got, ticks)
	}
	// On a busy host the samples may never catch the bomb exactly at its limit.
	near := make([]int, 3*ticks)
	for i := range near {
		near[i] = []int{250, 255, 247, 252}[i%4]
	}
	if got := run(near); got != ticks {
		t.Errorf("a bomb never sampled exactly at its limit: fired at sample %d, want %d", got, ticks)
	}
	busy := make([]int, 3*ticks)
	for i := range busy {
		busy[i] = 240 // many processes (94% of the limit), never a failed fork
	}
	if got := run(busy); got != -1 {
		t.Errorf("a workload that never reached its limit was ended at sample %d", got)
	}
	spike := append([]int{256, 256, 120}, busy[:2*ticks]...)
	spike = append(spike, make([]int, ticks)...)
	if got := run(spike); got != -1 {
		t.Errorf("a workload that touched its limit once and fell back was ended at sample %d", got)
	}
	// Falling back only to 86 % (below nine tenths, above half), then many processes again.
	back := append([]int{256, 256, 220, 220}, busy[:2*ticks]...)
	if got := run(back); got != -1 {
		t.Errorf("a workload that touched its limit and stayed below nine tenths was ended at sample %d", got)
	}
}

// TestBombWatchStarved: on a loaded host the agent's samples come seconds apart and a bomb
// churning at its limit may be sampled in a dip; one dip must not disarm the watch. The
// samples and their times are those of a sandbox that died of its host threads (a
// conformance fork bomb, 2026-12-07), where the watch fired at the fifth, 1.7 s later.
func TestBombWatchStarved(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	samples := []struct {
		cur int
		at  time.Duration
	}{{256, 0}, {219, 522 * time.Millisecond}, {251, 1326 * time.Millisecond}, {256, 2315 * time.Millisecond}, {256, 3007 * time.Millisecond}}
	w := bombWatch{max: 256}
	fired := -1
	for i, s := range samples {
		if w.observe(s.cur, t0.Add(s.at)) {
			fired = i
			break
		}
	}
	if fired != 2 {
		t.Errorf("a bomb sampled 256, 219, 251, 256, 256 over 3 s: fired at sample %d, want 2 (1.3 s after it was first at its limit: one dip does not disarm)", fired)
	}
}

// fakeCount is a process count that a test sets, and that counts its samples.
type fakeCount struct {
	mu      sync.Mutex
	cur     int
	samples int
}

func (f *fakeCount) set(n int) { f.mu.Lock(); f.cur = n; f.mu.Unlock() }
func (f *fakeCount) read() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.samples++
	return f.cur, nil
}
func (f *fakeCount) sampled() int { f.mu.Lock(); defer f.mu.Unlock(); return f.samples }

// TestBombGuardSleepsWhileNothingCanFork: with no guest process but waiting runners the guard
// takes no sample until woken; with one that stays alone it backs off to one sample in 8
// ticks; from a quarter of the limit it samples on every tick; at the limit it ends them all.
// Under gVisor's ptrace platform, sampling an idle guest was most of its CPU.
func TestBombGuardSleepsWhileNothingCanFork(t *testing.T) {
	const every, ticks = 10 * time.Millisecond, 60
	count := &fakeCount{}
	var idle atomic.Int64
	woken := make(chan struct{}, 1)
	wake := func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	}
	ended := make(chan time.Time, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		bombGuard{max: 100, every: every, slowest: 8 * every, count: count.read, idle: func() int { return int(idle.Load()) }, woken: woken,
			endAll: func(since time.Time) { ended <- since }}.run(ctx)
	}()
	defer func() { cancel(); <-done }()

	// quiet answers how many samples the guard took over `ticks` ticks.
	quiet := func() int {
		before := count.sampled()
		time.Sleep(ticks * every)
		return count.sampled() - before
	}
	waitSamples := func(what string) {
		t.Helper()
		before := count.sampled()
		deadline := time.Now().Add(30 * time.Second)
		for count.sampled() < before+5 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the guard took %d samples in 30 s, want it sampling every %s", what, count.sampled()-before, every)
			}
			time.Sleep(every)
		}
	}
	if n := quiet(); n > 1 {
		t.Errorf("no guest process: the guard took %d samples over %d ticks, want none after its first", n, ticks)
	}

	// A runner starts (woken), then waits for its code: nothing can fork.
	count.set(1)
	wake()
	waitSamples("a runner starting")
	idle.Store(1)
	time.Sleep(2 * every)
	if n := quiet(); n > 1 {
		t.Errorf("one waiting runner: the guard took %d samples over %d ticks, want none", n, ticks)
	}

	// An exec claims the runner (it leaves the waiting ones, then wakes the guard).
	idle.Store(0)
	wake()
	waitSamples("a runner claimed")

	// It runs alone: the guard backs off.
	time.Sleep(16 * every)
	if n := quiet(); n > ticks/8+3 {
		t.Errorf("one process, its count steady: the guard took %d samples over %d ticks, want at most %d", n, ticks, ticks/8+3)
	}
	// It forks a quarter of the limit: every tick again.
	count.set(25)
	time.Sleep(10 * every)
	if n := quiet(); n < ticks/3 {
		t.Errorf("a quarter of the limit: the guard took %d samples over %d ticks, want one a tick", n, ticks)
	}

	// The exec forks to the limit: all are ended, once they stayed there for atLimitFor.
	count.set(100)
	select {
	case since := <-ended:
		if el := time.Since(since); el < atLimitFor {
			t.Errorf("ended them all %s after the count reached the limit, want at least %s", el, atLimitFor)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a count at the limit for a minute: the guard never ended them")
	}

	// They are gone: the guard sleeps again.
	count.set(0)
	time.Sleep(2 * every)
	if n := quiet(); n > 1 {
		t.Errorf("after the bomb: the guard took %d samples over %d ticks, want none", n, ticks)
	}
}

// TestBombGuardLooksWhileAsleep is the attack on the guard's trust in runners: under gVisor
// guest root reaches the agent's socket, so a guest process can start a "runner" that says it
// is ready and then forks. Counted idle, it left the guard asleep until the agent's next start
// or hand-off, which need never come: the bomb stayed at its limit and was never ended. The
// guard now looks every `asleep` while it sleeps.
func TestBombGuardLooksWhileAsleep(t *testing.T) {
	const every = 10 * time.Millisecond
	count := &fakeCount{}
	count.set(1)
	ended := make(chan time.Time, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		bombGuard{max: 100, every: every, slowest: 8 * every, asleep: 20 * every, count: count.read,
			idle: func() int { return 1 }, woken: make(chan struct{}), endAll: func(since time.Time) { ended <- since }}.run(ctx)
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(5 * every) // the guard has taken its first sample and sleeps: one idle runner
	count.set(100)        // the "runner" forks to the limit, and nothing wakes the guard
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatalf("a process counted idle forked to the limit without waking the guard: not ended in 30 s (%d samples)", count.sampled())
	}
}
