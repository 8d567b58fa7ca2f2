package agent

import (
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
}
