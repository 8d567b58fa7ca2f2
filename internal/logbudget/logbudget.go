// Package logbudget bounds the lines that a tenant's code makes the platform log: a plugin's
// wb.log, the host's line for each of its failed calls, a policy's failed evaluation. Each is
// bounded per call, but the calls are as many as the tenant's guests cause (every exec and
// egress attempt, thousands a second), and the operator's log is shared.
package logbudget

import (
	"fmt"
	"sync"
	"time"
)

const (
	// Burst is how many lines a key (a project) may log at once, Rate how many a second
	// after that.
	Burst = 256
	Rate  = 64
	// NoteEvery bounds how often Take asks for a note of the lines dropped.
	NoteEvery = 10 * time.Second
)

// Budget is a token bucket of lines for each key: Burst at once, refilled at Rate a second.
// It holds a bucket for each key that logged (projects, which are the operator's to make).
// The zero value is ready; safe for concurrent use.
type Budget struct {
	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens  float64
	at      time.Time // of the last refill
	dropped int       // lines dropped since the last note of them
	noted   time.Time // the last note
}

// Take answers whether key may log one line at now, and the count of its lines dropped that
// the caller should now note in a line of its own (0: none, or noted less than NoteEvery ago).
func (b *Budget) Take(key string, now time.Time) (ok bool, note int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buckets == nil {
		b.buckets = map[string]*bucket{}
	}
	k := b.buckets[key]
	if k == nil {
		k = &bucket{tokens: Burst, at: now}
		b.buckets[key] = k
	}
	if d := now.Sub(k.at); d > 0 {
		k.tokens = min(Burst, k.tokens+d.Seconds()*Rate)
		k.at = now
	}
	if ok = k.tokens >= 1; ok {
		k.tokens--
	} else {
		k.dropped++
	}
	if k.dropped > 0 && now.Sub(k.noted) >= NoteEvery {
		note, k.dropped, k.noted = k.dropped, 0, now
	}
	return ok, note
}

// Limits names the budget in a note, for the operator.
func Limits() string { return fmt.Sprintf("%d lines at once, %d a second", Burst, Rate) }
