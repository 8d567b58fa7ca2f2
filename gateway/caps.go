package gateway

import (
	"fmt"
	"sync"
	"time"
)

// Defaults of the work caps in Config.
const (
	// DefaultMaxConcurrentExecs is how many execs (buffered or streamed, and runs with
	// wait=true) one project may have running at once on one gateway.
	DefaultMaxConcurrentExecs = 64
	// DefaultMaxAsyncRuns is how many runs with wait=false one project may have queued or
	// running at once on one gateway (they run in its goroutines).
	DefaultMaxAsyncRuns = 256
	// DefaultMaxStoredOutputBytes is the budget of one project's stored output: runs' and the
	// answers kept for Idempotency-Key replays (store/kept.go).
	DefaultMaxStoredOutputBytes = 1 << 30
	// capRetryAfter is the Retry-After of a 429 for a full cap: work ends in seconds.
	capRetryAfter = time.Second
)

// projectSlots counts one kind of work in flight per project, in this process: the work runs
// here, so this is where it has to be bounded.
type projectSlots struct {
	what string // "exec", "async run": for the 429's message
	code string
	mu   sync.Mutex
	n    map[string]int
}

func newProjectSlots(what, code string) *projectSlots {
	return &projectSlots{what: what, code: code, n: map[string]int{}}
}

// acquire takes a slot of project, or answers a 429 when it already holds max. The caller
// calls release exactly once after a nil error.
func (ps *projectSlots) acquire(project string, max int) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.n[project] >= max {
		return &apiError{Status: 429, Type: "rate_limited", Code: ps.code, RetryAfter: capRetryAfter,
			Message: fmt.Sprintf("this project already has %d %ss in progress, the most it may have at once; retry when one ends (Retry-After)", max, ps.what)}
	}
	ps.n[project]++
	return nil
}

func (ps *projectSlots) release(project string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.n[project]--; ps.n[project] <= 0 {
		delete(ps.n, project)
	}
}
