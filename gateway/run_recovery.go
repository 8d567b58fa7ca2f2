package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"wb/session"
	"wb/store"
)

// A run is worked on by the gateway that took its request, which alone knows its command.
// That gateway holds a lease on its attempt at the run (store.SetRunWork, taken before the
// run is recorded queued) and renews it until it has recorded the run's end. A gateway that
// stopped first (killed, its host lost, cut off from Redis) left the run queued or running
// for ever, with no run.finished; now, once the lease runs out, any gateway's recovery loop
// claims it and records the run failed, with a message that says to run it again, and its
// run.finished event, in one script (store.FailRun).
//
// The recovery never runs the command again: a run that is running may have run it (part or
// all of it), and the request that knew it is gone. A queued run has not: its gateway records
// it running (store.StartRun) before it starts the command, and both writes compare the
// state, so a gateway that was slow rather than dead finds the run failed and does not start
// it. A run ends once: a gateway cut off from Redis (or slow) long enough to lose the lease
// while its command runs finds, when it comes to record the end, the recovery's, which
// stands (store.FinishRun compares the state): its run.finished went out, and a second,
// saying otherwise, would contradict it. That gateway answers its caller the run as
// recorded. An ephemeral run's session, used by nothing else, is stopped with it: the
// recovery cannot tell a gateway cut off from one that is dead, and a session left running
// would hold a slot, billed, until its idle timeout; the command it cuts short is the one
// already recorded failed.

// orphanRunMessage is the error of a run whose gateway stopped before it recorded its end.
const orphanRunMessage = session.RunOrphaned

// endRunWork ends this server's work on the attempt; release lets go of its lease (the run's
// end is recorded, or the attempt does not own the run), else the lease is left to run out,
// for a recovery to end the run if it must.
func (s *Server) endRunWork(ref store.RunRef, release bool) {
	defer s.runs.end(ref, ref.Attempt)
	if !release {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), runRecordTimeout)
	defer cancel()
	if _, err := s.Store.ReleaseRunWork(ctx, ref, ref.Attempt); err != nil {
		s.log.Warn("run: release the work lease", "run", ref.ID, "err", err)
	}
}

// runRunRecovery ends the runs whose lease ran out, until ctx ends.
func (s *Server) runRunRecovery(ctx context.Context) {
	runDeadlines(ctx, s, "run recovery: read leases", s.Store.DueRunWork, s.recoverRun, nil)
}

// recoverRun claims one attempt's lapsed lease and ends its run, if the attempt owns it and it
// has not ended. A lease that lapsed while this server still works on the attempt (its
// renewals failed) is renewed instead.
func (s *Server) recoverRun(ctx context.Context, ref store.RunRef, now time.Time) {
	if _, ok := s.runs.working(ref); ok {
		if _, err := s.Store.RenewRunWork(ctx, ref, now.Add(s.workLease())); err != nil {
			s.log.Warn("run: renew the work lease", "run", ref.ID, "err", err)
		}
		return
	}
	token := session.NewID("lease_", now)
	claimed, err := s.Store.ClaimRunWork(ctx, ref, token, now, now.Add(s.workLease()))
	if err != nil || !claimed {
		return // another gateway was first, or Redis is away: the next round sees
	}
	if err := s.endOrphanRun(ctx, ref); err != nil {
		if ctx.Err() == nil {
			s.log.Error("run: end a run whose gateway stopped working on it", "run", ref.ID, "err", err)
		}
		return // the claim runs out and is taken again
	}
	if _, err := s.Store.ReleaseRunWork(ctx, ref, token); err != nil {
		s.log.Warn("run: release the work lease", "run", ref.ID, "err", err)
	}
}

// endOrphanRun records failed the run of an attempt whose gateway stopped working on it,
// unless the attempt does not own it (it never made the record, or another request with its
// Idempotency-Key did) or the run has ended (its gateway stopped after it recorded the end,
// before it let go of the lease).
func (s *Server) endOrphanRun(ctx context.Context, ref store.RunRef) error {
	for range 3 {
		run, owner, err := s.Store.GetRunOwner(ctx, ref.Project, ref.ID)
		if errors.Is(err, store.ErrNotFound) || (err == nil && (owner != ref.Attempt || runEnded(run.State))) {
			return nil
		}
		if err != nil {
			return err
		}
		from, msg := run.State, orphanRunMessage
		run.State, run.Error, run.FinishedAt = session.RunFailed, &msg, session.At(s.Now())
		failed, err := s.Store.FailRun(ctx, ref.Project, run, owner, from, eventRun(run))
		if err != nil {
			return err
		}
		if failed {
			s.log.Warn("run: its gateway stopped before it finished; recorded failed", "run", ref.ID, "was", from)
			s.stopOrphanRunSession(ctx, ref.Project, run)
			return nil
		}
		// It moved on meanwhile (its gateway, slow rather than dead, started the command or
		// ended the run): read it again.
	}
	return fmt.Errorf("run %s kept changing", ref.ID)
}

// stopOrphanRunSession stops the session of an ephemeral run that a recovery ended: made for
// the run alone, it would otherwise hold a slot, billed, until its idle timeout.
func (s *Server) stopOrphanRunSession(ctx context.Context, project string, run *session.Run) {
	if run.SessionID == nil || *run.SessionID == "" {
		return
	}
	sess, err := s.Store.Get(ctx, project, *run.SessionID)
	if err != nil || sess.Metadata[session.RunMetadataKey] == "" || sess.State.Terminal() || sess.State == session.Stopping {
		return // gone, ended, or the caller's own session (its other work is not the run's)
	}
	p, err := s.Store.GetProject(ctx, project)
	if err == nil {
		_, _, err = s.stop(ctx, p, sess.ID)
	}
	if err != nil {
		s.log.Warn("run: stop the session of an ephemeral run whose gateway stopped", "session", sess.ID, "err", err)
	}
}
