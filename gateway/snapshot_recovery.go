package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"wb/session"
	"wb/store"
)

// A session's snapshot runs in the gateway that took the request: it moves the session to
// snapshotting, asks the node, records the snapshot and moves the session back to running.
// No other transition leaves snapshotting (but the host's failure), so a gateway that died
// in between would leave the session there for ever: billed, and refused a delete (409).
// While it works the gateway holds a lease on the snapshot, token the snapshot's id
// (store.SetSnapshotWork). When the lease runs out unrenewed, any gateway's recovery loop
// claims it, records the snapshot failed (unless it was recorded), and returns the session to
// running. Both that move and the gateway's own name the snapshot (store.Change.Snapshot), so
// that the one that comes late (a gateway alive, its renewals late) cannot end the session's
// next snapshot. The node carries on as it would have: a guest whose snapshot was under way is
// back once it is done, and calls made meanwhile wait for it; a guest lost with it fails the
// session (guest_crash). A desktop's sleep holds the same lease while the node saves its
// session's guest as the session stops (saveStateAndStop): should that gateway die, the
// snapshot is recorded failed, so that its files can be found and deleted.

// holdSnapshotLease takes the lease on snapshot snapID of ref's session and keeps it renewed
// until end is called: end(true) lets go of it too (the snapshot is recorded, or given up);
// end(false) leaves it to run out, for a recovery to end the snapshot. Only the first call
// counts. A lease that cannot be taken is logged: the renewals take it, or the placer's sweep
// gives the session one.
func (s *Server) holdSnapshotLease(ctx context.Context, ref store.SessionRef, snapID string) (end func(release bool)) {
	s.snapshots.begin(ref, snapID)
	if err := s.Store.SetSnapshotWork(ctx, ref, snapID, s.Now().Add(s.workLease())); err != nil {
		s.log.Warn("snapshot: take the work lease", "session", ref.ID, "err", err)
	}
	stopRenewing := s.keepRenewed(ctx, "snapshot", ref.ID, func(ctx context.Context, until time.Time) (bool, error) {
		return s.Store.RenewSnapshotWork(ctx, ref, snapID, until)
	})
	var once sync.Once
	return func(release bool) {
		once.Do(func() {
			stopRenewing()
			if release {
				if _, err := s.Store.ReleaseSnapshotWork(ctx, ref, snapID); err != nil {
					s.log.Warn("snapshot: release the work lease", "session", ref.ID, "err", err)
				}
			}
			s.snapshots.end(ref, snapID)
		})
	}
}

// runSnapshotRecovery ends the snapshots whose lease ran out, until ctx ends.
func (s *Server) runSnapshotRecovery(ctx context.Context) {
	runDeadlines(ctx, s, "snapshot recovery: read leases", s.Store.DueSnapshotWork, s.recoverSnapshot, nil)
}

// recoverSnapshot claims one session's lapsed snapshot lease and ends the snapshot. A lease
// that lapsed while this server still takes the snapshot is renewed instead.
func (s *Server) recoverSnapshot(ctx context.Context, ref store.SessionRef, now time.Time) {
	if mine, ok := s.snapshots.working(ref); ok {
		if _, err := s.Store.RenewSnapshotWork(ctx, ref, mine, now.Add(s.workLease())); err != nil {
			s.log.Warn("snapshot: renew the work lease", "session", ref.ID, "err", err)
		}
		return
	}
	snapID, claimed, err := s.Store.ClaimSnapshotWork(ctx, ref, now, now.Add(s.workLease()))
	if err != nil || !claimed {
		return // another gateway was first, or Redis is away: the next round sees
	}
	sess, err := s.Store.Get(ctx, ref.Project, ref.ID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return // the claim runs out and is taken again
	}
	if err := s.endOrphanSnapshot(ctx, ref, sess, snapID); err != nil {
		if ctx.Err() == nil {
			s.log.Error("snapshot: end a snapshot whose gateway stopped working on it", "session", ref.ID, "snapshot", snapID, "err", err)
		}
		return
	}
	if _, err := s.Store.ReleaseSnapshotWork(ctx, ref, snapID); err != nil {
		s.log.Warn("snapshot: release the work lease", "session", ref.ID, "err", err)
	}
}

// endOrphanSnapshot ends a snapshot whose gateway stopped working on it: the snapshot is
// recorded failed unless it was recorded, and a session left in snapshotting (sess: nil when
// gone) runs again, if it still takes that snapshot (snapID; "" for one unknown). A
// snapshot taken as its session stops (a desktop's sleep) leaves the session stopping.
//
// A snapshot its gateway recorded stays as it was: that gateway got to the end of its work
// and then failed to move the session back, or did move it and failed to let go of the
// lease (the session then runs, or takes its next snapshot, which this one's end spares). A
// snapshot unrecorded is one whose gateway died, or still works with its renewals late:
// that gateway then records the snapshot over this.
func (s *Server) endOrphanSnapshot(ctx context.Context, ref store.SessionRef, sess *session.Session, snapID string) error {
	// A session running (or paused) again left snapshotting through its gateway's last step,
	// which follows the record: a record missing now was deleted since, and stays so.
	if snapID != "" && (sess == nil || (sess.State != session.Running && sess.State != session.Paused)) {
		snap := session.Snapshot{ID: snapID, Object: "snapshot", SessionID: ref.ID, State: session.SnapshotFailed, CreatedAt: *session.At(s.Now()),
			FailureReason: "the gateway taking the snapshot stopped before it was done; take it again"}
		if sess != nil {
			snap.Template, snap.Tier, snap.NodeID = sess.Template, sess.Tier, sess.NodeID
		}
		recorded, err := s.Store.PutObjectIfAbsent(ctx, ref.Project, store.KindSnapshot, snapID, snap)
		if err != nil {
			return err
		}
		if recorded {
			s.log.Warn("snapshot: its gateway stopped working on it; recorded failed", "session", ref.ID, "snapshot", snapID)
		}
	}
	if sess == nil || sess.State != session.Snapshotting {
		return nil
	}
	c := store.Change{Project: ref.Project, ID: ref.ID, From: session.Snapshotting, To: session.Running, Driver: session.Caller,
		Snapshot: snapID}
	if snapID == "" {
		c.Version = sess.Version // which snapshot it takes is unknown: the one seen, at least
	}
	_, err := s.Store.Transition(ctx, c)
	var ce *store.ConflictError
	if errors.As(err, &ce) {
		// It moved on meanwhile (its gateway was alive after all, or the host failed), or it
		// takes another snapshot, which this one's end must not end.
		return nil
	}
	if err != nil {
		return err
	}
	s.log.Warn("snapshot: its gateway stopped working on it; the session runs again", "session", ref.ID, "snapshot", snapID)
	s.forgetSessions(ref.Project)
	return nil
}
