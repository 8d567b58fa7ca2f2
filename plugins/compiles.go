package plugins

import (
	"context"
	"slices"
	"sync"
)

// maxCompiles bounds the compiles that run at once in a host, and a project has at most one
// of them: a compile holds a few hundred times its largest function in the heap (at the
// bounds, +231 MiB at the peak for 18 s), so compiles are not left to run side by side without
// bound; and with one slot for everyone, one project's slow module (18 s at the bounds, and
// any number of them one after another) made every other project's uploads and first loads
// wait. With two, and one a project, another project finds a slot free unless two other
// projects compile at once.
const maxCompiles = 2

// compileSlots admits compiles: at most maxCompiles at once, at most one a project, and the
// waiting callers are served in their order of arrival, skipping those whose project already
// compiles.
type compileSlots struct {
	mu      sync.Mutex
	free    int
	running map[string]bool // projects compiling
	queue   []*compileWaiter
}

type compileWaiter struct {
	project string
	granted chan struct{} // closed when the slot is the waiter's
	ok      bool          // granted, under mu
}

func newCompileSlots() *compileSlots {
	return &compileSlots{free: maxCompiles, running: map[string]bool{}}
}

// acquire waits, under ctx, for a slot for a compile of project ("" for the compiles of no
// project, which share a slot). The caller gives it back with release.
func (s *compileSlots) acquire(ctx context.Context, project string) error {
	w := &compileWaiter{project: project, granted: make(chan struct{})}
	s.mu.Lock()
	s.queue = append(s.queue, w)
	s.grantLocked()
	s.mu.Unlock()
	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.ok { // granted as the context ended
		s.mu.Unlock()
		s.release(project)
		return ctx.Err()
	}
	if i := slices.Index(s.queue, w); i >= 0 {
		s.queue = slices.Delete(s.queue, i, i+1)
	}
	s.mu.Unlock()
	return ctx.Err()
}

// release gives back project's slot.
func (s *compileSlots) release(project string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free++
	delete(s.running, project)
	s.grantLocked()
}

// grantLocked gives the free slots to the first waiters whose project does not compile.
func (s *compileSlots) grantLocked() {
	for i := 0; i < len(s.queue) && s.free > 0; {
		w := s.queue[i]
		if s.running[w.project] {
			i++
			continue
		}
		s.running[w.project] = true
		s.free--
		w.ok = true
		close(w.granted)
		s.queue = slices.Delete(s.queue, i, i+1)
	}
}
