package gateway

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"wb/session"
	"wb/store"
)

// What a create refused for want of Redis may leave behind (a slot held, or a session written
// whose answer was lost) is cleaned up in the background once Redis answers again.

// maxPendingCleanups bounds the cleanups of each kind waiting at once: each is a goroutine,
// and an outage refuses every create at the rate they come.
const maxPendingCleanups = 1024

// abandonFor is how long a cleanup of a session written unanswered keeps trying: past it, the
// session ends by its own idle timeout, as before.
const abandonFor = 10 * time.Minute

// retryLater runs try in the background, 250 ms from now and then twice as long each time up
// to 5 s, until it succeeds or until has passed, and answers try's last error then (nil: it
// succeeded) to done. It answers false, and runs nothing, when maxPendingCleanups counted by
// pending wait already.
func (s *Server) retryLater(pending *atomic.Int32, until time.Time, try func(context.Context) error, done func(error)) bool {
	if pending.Add(1) > maxPendingCleanups {
		pending.Add(-1)
		return false
	}
	s.goBackground(func() {
		defer pending.Add(-1)
		for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(wait):
			}
			ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
			err := try(ctx)
			cancel()
			if err == nil || time.Now().After(until) {
				done(err)
				return
			}
		}
	})
	return true
}

// releaseLater gives back, in the background, the slot of a refused create whose release
// failed (Redis unreachable, as in a failover: the create's write failed, and its release
// with it), or that its reservation may hold with its answer lost (r.Unsure), until the
// release goes through or the reservation has lapsed. Without it the slot stayed held until
// the project's next create after the lapse (store.ReservationLapse), and for good in a
// project that created nothing more. A release is safe to repeat, late, and to make when no
// slot was held: it frees only a reservation that no session was written under and that no
// retry took over (a create with the same Idempotency-Key, which shares the slot).
func (s *Server) releaseLater(r store.Reservation, cause error) {
	what, warn, fail := "a refused create's slot", slog.LevelWarn, slog.LevelError
	if r.Unsure() {
		// Most often it held nothing (its command failed before Redis ran it), and in an
		// outage every create's reservation fails so: a line each would drown the log.
		what, warn, fail = "a refused create's slot, if its reservation held one,", slog.LevelDebug, slog.LevelDebug
	}
	log := func(level slog.Level, msg string, err error) {
		args := []any{"session", r.ID}
		if err != nil {
			args = append(args, "err", err)
		}
		s.log.Log(context.Background(), level, what+" "+msg, args...)
	}
	started := s.retryLater(&s.releases, time.Now().Add(store.ReservationLapse),
		func(ctx context.Context) error { return s.Store.Release(ctx, r) },
		func(err error) {
			if err != nil {
				log(fail, "is held until it lapses", err)
				return
			}
			log(min(warn, slog.LevelInfo), "is given back", nil)
		})
	if !started {
		log(fail, "is held until it lapses: too many cleanups wait already", cause)
		return
	}
	log(warn, "is given back in the background", cause)
}

// abandonLater ends, in the background, the session of a refused create whose write may have
// gone through with its answer lost (Redis went away under it): the caller was told the
// create failed, and never learns the session's id, so it would run unseen, and be billed,
// until its idle timeout. A session found is deleted as a caller's delete would (in pending
// it ends at once, unbilled); none found means none was written. Only for an id made for
// this create (fresh): one given (an idempotency key's, a desktop's) is the caller's to
// retry, and finds the session then.
func (s *Server) abandonLater(p store.Project, id string, fresh bool, cause error) {
	if !fresh {
		return
	}
	deleted := false
	started := s.retryLater(&s.abandons, time.Now().Add(abandonFor), func(ctx context.Context) error {
		_, _, err := s.stop(ctx, p, id)
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == 404 {
			return nil // never written
		}
		deleted = err == nil
		return err
	}, func(err error) {
		switch {
		case err != nil:
			s.log.Warn("a refused create's session, if it was written, runs until its idle timeout", "session", id, "err", err)
		case deleted:
			s.log.Info("a refused create's session was written after all (its answer was lost); it is deleted", "session", id)
		}
	})
	if !started {
		// At debug: in an outage every create comes here, and most wrote nothing.
		s.log.Debug("a refused create's session, if it was written, runs until its idle timeout: too many cleanups wait already",
			"session", id, "err", cause)
	}
}

// writtenUnanswered answers the session that a create's own write made, whose answer was
// lost, as the create's, and signals its work as the lost answer's caller would have.
func (s *Server) writtenUnanswered(ctx context.Context, p store.Project, id string) (store.Admitted, error) {
	sess, err := s.Store.Get(ctx, p.ID, id)
	if err != nil {
		// Not found is a failover's too (the write went to the old primary): the create is
		// the caller's to retry, not a 404 (abandonLater ends the session should it show).
		s.log.Warn("a create's write went through unanswered, and its session cannot be read", "session", id, "err", err)
		return store.Admitted{}, &apiError{Status: 503, Type: "api_error", Code: "store_unavailable", RetryAfter: time.Second,
			Message: "the platform's data store is failing over; retry shortly (a create with the same Idempotency-Key)"}
	}
	s.Store.SignalCreated(ctx, sess)
	s.log.Info("a create's write went through unanswered; its session is answered", "session", id)
	return store.Admitted{Session: sess}, nil
}

// writeUnanswered reports whether a create's failed write may have gone through all the
// same: any failure but a refusal the store answered.
func writeUnanswered(err error) bool {
	var re *store.RateLimitError
	var se *store.SpendCapError
	var ce *store.ConcurrencyError
	var fe *session.FieldError
	var te *session.TransitionError
	return err != nil && !errors.Is(err, store.ErrExists) && !errors.Is(err, store.ErrLapsed) && !errors.As(err, &re) && !errors.As(err, &se) &&
		!errors.As(err, &ce) && !errors.As(err, &fe) && !errors.As(err, &te)
}
