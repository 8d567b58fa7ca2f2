package testwait

import (
	"testing"
	"time"
)

// poll is how often For looks again.
const poll = 5 * time.Millisecond

// For polls cond until it holds, and fails t if it does not within limit.
func For(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
		time.Sleep(poll)
	}
}
