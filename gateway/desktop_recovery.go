package gateway

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"wb/desktop"
	"wb/session"
	"wb/store"
)

// The work behind a desktop's transition (starting, stopping) runs in the gateway that took
// the request, under a lease in Redis that it renews while it works. A gateway that dies
// mid-transition stops renewing; when its lease ends, any gateway's recovery loop claims it
// and resumes the work from the record: a start from the session it recorded (admitted or
// not), a stop or sleep from its snapshots. Without this a desktop would stay starting or
// stopping for ever, and a started session would bill with no desktop to show for it.

// leaseAhead gives the desktop, about to enter starting or stopping, a lease held by nobody
// that ends one work lease from now, unless it has one (store.EnsureDesktopWork). The state
// and the lease are two writes (two hash slots on a Cluster): a gateway that died between
// the state's and transitionWork's lease left the desktop in its transition for ever, with no
// lease for a recovery to find. Now the recovery finds this one once that grace has passed,
// and resumes the work; the working gateway's lease replaces it at once, or its renewal takes
// it over (transitionWork's failed). One left by a write that did not happen is released by
// the recovery, which finds the desktop in no transition.
func (s *Server) leaseAhead(ctx context.Context, project, id string) error {
	if _, err := s.Store.EnsureDesktopWork(ctx, store.DesktopRef{Project: project, ID: id}, s.Now().Add(s.workLease())); err != nil {
		return fmt.Errorf("desktop %s: %w", id, err)
	}
	return nil
}

// leaseOrphan gives a desktop that has been starting or stopping for longer than a work lease
// a lease due now, unless it has one, so that a recovery resumes its work: one left so by a
// gateway from before leaseAhead, or whose lease ahead was not set (a finishing work released
// its own lease, which the lease ahead found and kept, just before the state was written).
// A desktop whose work runs has its lease, and keeps it as it is. Called where a caller looks
// at a desktop (GET, a call that waits for it), and by the sweep (sweepDesktops), which looks
// at every desktop in turn. It answers whether it looked.
func (s *Server) leaseOrphan(ctx context.Context, rec desktop.Record) bool {
	if rec.State != desktop.Starting && rec.State != desktop.Stopping || s.Now().Sub(rec.UpdatedAt.Time) < s.workLease() {
		return false
	}
	set, err := s.Store.EnsureDesktopWork(ctx, store.DesktopRef{Project: rec.ProjectID, ID: rec.ID}, s.Now())
	if err != nil {
		s.log.Warn("desktop: look for the lease of its transition", "desktop", rec.ID, "err", err)
	} else if set {
		s.log.Warn("desktop: its transition had no lease; a recovery resumes it", "desktop", rec.ID, "state", rec.State)
	}
	return true
}

// A desktop left starting or stopping with no lease (by a gateway from before leases on
// desktops, or the race that leaseOrphan names) was found only when a caller looked at it;
// one that nobody looked at stayed so for ever, its session (if it had one) billed. The sweep
// looks at every desktop in turn: every DesktopSweep, one gateway of the fleet walks every
// project's desktops, desktopSweepBatch at a time with desktopSweepPause between (the work of
// one pass is bounded however many desktops there are), and gives such a desktop a lease due
// now (leaseOrphan), which a recovery takes. Which gateway walks is a turn in Redis
// (store.TakeDesktopSweep) that its holder extends at each pass and that ends one period after
// its last: every gateway walked every period, and N gateways read every desktop N times a
// period for what one walk finds. A holder that dies leaves its turn to end, and the first
// gateway that asks after that walks.

const (
	// DefaultDesktopSweep is how long the fleet waits between two walks of every desktop.
	DefaultDesktopSweep = 10 * time.Minute
	// desktopSweepBatch bounds a pass of the sweep: at most this many desktops read, and as
	// many projects' lists.
	desktopSweepBatch = 100
	// desktopSweepPause is the wait between two passes of one walk.
	desktopSweepPause = time.Second
)

func (s *Server) desktopSweep() time.Duration {
	if s.DesktopSweep > 0 {
		return s.DesktopSweep
	}
	return DefaultDesktopSweep
}

// runDesktopSweep walks every desktop, a pass at a time, in this gateway's turns, until ctx
// ends. It first asks for the turn at a random point of the first period (the gateways that a
// deploy starts together do not ask together), then one period after its walk, or, while
// another gateway has the turn, soon after that turn ends.
func (s *Server) runDesktopSweep(ctx context.Context) {
	period := s.desktopSweep()
	token := session.NewID("sweep_", s.Now())
	wait := rand.N(period)
	var walk desktopWalk
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		mine, left, err := s.Store.TakeDesktopSweep(ctx, token, period)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("desktop sweep", "err", err)
			}
			wait = desktopSweepPause
			continue
		}
		if !mine {
			// Another gateway's turn (a walk of its own, from its start): ask again once it
			// ends, the gateways that wait at points spread over a tenth of the period.
			walk, wait = desktopWalk{}, left+rand.N(max(period/10, time.Millisecond))
			continue
		}
		_, done, err := s.sweepDesktops(ctx, &walk, desktopSweepBatch)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("desktop sweep", "err", err)
		}
		wait = desktopSweepPause
		if done {
			walk, wait = desktopWalk{}, period
		}
	}
}

// desktopWalk is where a walk of every desktop is: the projects it walks (read at its start),
// the one it is at, and the cursor in that one's desktops.
type desktopWalk struct {
	projects []string
	project  int
	cursor   string
}

// sweepDesktops makes one pass of w: from where the last pass left off, it reads at most
// batch desktops, of at most batch projects, and gives those left in a transition a lease
// (leaseOrphan). It answers how many desktops it read, and whether the walk is done. A
// project whose desktops cannot be read is left for the next walk, lest one bad record (or a
// Redis away) hold the walk where it is.
func (s *Server) sweepDesktops(ctx context.Context, w *desktopWalk, batch int) (int, bool, error) {
	if w.projects == nil {
		projects, err := s.Store.Projects(ctx)
		if err != nil {
			return 0, false, fmt.Errorf("read the projects: %w", err)
		}
		slices.Sort(projects)
		w.projects = projects
	}
	read := 0
	var errs []error
	for lists := 0; w.project < len(w.projects) && read < batch && lists < batch; lists++ {
		project := w.projects[w.project]
		recs, next, err := s.Store.ListDesktops(ctx, project, min(batch-read, store.MaxListLimit), w.cursor)
		if err != nil {
			errs = append(errs, fmt.Errorf("project %s: %w", project, err))
			next = ""
		}
		for _, rec := range recs {
			s.leaseOrphan(ctx, rec)
		}
		read += len(recs)
		if w.cursor = next; next == "" {
			w.project++
		}
	}
	return read, w.project == len(w.projects), errors.Join(errs...)
}

// transitionWork runs f, the work of the desktop's transition, in the background under a
// new lease (superseding any older work's). f answers false when it could not finish for want
// of Redis: the lease is then left to run out, and a recovery resumes the work.
func (s *Server) transitionWork(project, id string, f func() bool) {
	ref := store.DesktopRef{Project: project, ID: id}
	token := session.NewID("lease_", s.Now())
	leased := true
	if err := s.Store.SetDesktopWork(s.ctx, ref, token, s.Now().Add(s.workLease())); err != nil {
		// The work goes on; should this gateway die, nothing resumes it.
		s.log.Warn("desktop: take the work lease", "desktop", id, "err", err)
		leased = false
	}
	s.goBackground(func() {
		if !s.holdLease(ref, token, f) && !leased {
			s.leaseLater(ref, token)
		}
	})
}

// leaseLater sets, due at once, the lease of work that stopped for want of Redis and never
// had one (Redis failed its first lease too), so that a recovery resumes it; it keeps trying
// for desktopRecordFor.
func (s *Server) leaseLater(ref store.DesktopRef, token string) {
	for wait, until := time.Second, time.Now().Add(s.desktopRecordFor()); ; wait = min(2*wait, 10*time.Second) {
		err := s.Store.SetDesktopWork(s.ctx, ref, token, s.Now())
		if err == nil {
			return
		}
		if time.Now().After(until) {
			s.log.Error("desktop: its work stopped for want of Redis and has no lease: it stays in its state until a caller moves it",
				"desktop", ref.ID, "err", err)
			return
		}
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// holdLease renews lease token while f runs, and releases it when f is done. When the
// gateway is closing, f stops early, and when f answers false it could not finish: either way
// the lease is left to run out, so that a recovery (this gateway's or another's) resumes the
// work. It answers whether the work finished.
func (s *Server) holdLease(ref store.DesktopRef, token string, f func() bool) bool {
	s.leases.begin(ref, token)
	defer s.leases.end(ref, token)
	stop := s.keepRenewed(s.ctx, "desktop", ref.ID, func(ctx context.Context, until time.Time) (bool, error) {
		return s.Store.RenewDesktopWork(ctx, ref, token, until)
	})
	done := f()
	stop()
	if !done || s.ctx.Err() != nil {
		return false
	}
	if _, err := s.Store.ReleaseDesktopWork(s.ctx, ref, token); err != nil {
		s.log.Warn("desktop: release the work lease", "desktop", ref.ID, "err", err)
	}
	return true
}

// runDesktopRecovery takes over the transitions whose lease ran out, until ctx ends.
func (s *Server) runDesktopRecovery(ctx context.Context) {
	runDeadlines(ctx, s, "desktop recovery: read leases", s.Store.DueDesktopWork, s.recoverDesktop, nil)
}

// recoverDesktop claims the lapsed lease of one desktop and resumes its transition. A lease
// that lapsed while this server still works on it (its renewals failed: Redis away, or a host
// so loaded that they came late) is renewed instead: a second work beside the first fought
// it (a cold make test's sleep found the session snapshotting, and the desktop went to sleep
// without its state).
func (s *Server) recoverDesktop(ctx context.Context, ref store.DesktopRef, now time.Time) {
	if mine, ok := s.leases.working(ref); ok {
		if _, err := s.Store.RenewDesktopWork(ctx, ref, mine, now.Add(s.workLease())); err != nil {
			s.log.Warn("desktop: renew the work lease", "desktop", ref.ID, "err", err)
		}
		return
	}
	token := session.NewID("lease_", now)
	claimed, err := s.Store.ClaimDesktopWork(ctx, ref, token, now, now.Add(s.workLease()))
	if err != nil || !claimed {
		return // another gateway was first, or Redis is away: the next round sees
	}
	release := func() { _, _ = s.Store.ReleaseDesktopWork(ctx, ref, token) }
	rec, err := s.Store.GetDesktop(ctx, ref.Project, ref.ID)
	if errors.Is(err, store.ErrNotFound) {
		release()
		return
	}
	if err != nil {
		return // the claim runs out and is taken again
	}
	p, err := s.Store.GetProject(ctx, ref.Project)
	if err != nil {
		return
	}
	var work func() bool
	switch rec.State {
	case desktop.Starting:
		// A start restores the memory snapshot exactly when the record still has one (a
		// Start, from stopped or failed, never has; a wake that fell back dropped it) and no
		// resize came since (a saved state belongs to its size: the next halt drops it).
		_, resized := rec.StartSize()
		work = func() bool { return s.startDesktop(p, rec, rec.MemorySnapshot != "" && !resized, nil) }
	case desktop.Stopping:
		work = func() bool { return s.haltDesktop(p, rec) }
	default:
		release() // the work ended, and its gateway died before it said so
		return
	}
	s.log.Info("desktop: resuming a transition whose gateway stopped working on it", "desktop", rec.ID, "state", rec.State)
	s.goBackground(func() { s.holdLease(ref, token, work) })
}
