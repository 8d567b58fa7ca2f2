package gateway

import (
	"context"
	"log/slog"
	"time"

	"wb/store"
)

// maxPendingReleases bounds the slots given back in the background at once: each is a
// goroutine, and an outage refuses every create at the rate they come.
const maxPendingReleases = 1024

// releaseLater gives back, in the background, the slot of a refused create whose release
// failed (Redis unreachable, as in a failover: the create's write failed, and its release
// with it), or that its reservation may hold with its answer lost (r.Unsure). It tries 250
// ms later, then twice as long each time up to 5 s, until the release goes through or the
// reservation has lapsed. Without it the slot stayed held until the project's next create
// after the lapse (store.ReservationLapse), and for good in a project that created nothing
// more. A release is safe to repeat, and to make when no slot was held: it frees only a
// reservation that no session was written under. But a create whose id was given (fresh
// false: an idempotency key's, a desktop's) is left to the lapse: the caller's retry of it
// reserves under the same id, sharing the slot, and a late release would take it from under
// the retry, whose write would then fail.
func (s *Server) releaseLater(r store.Reservation, fresh bool, cause error) {
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
	if !fresh {
		log(fail, "is held until it lapses", cause)
		return
	}
	if s.releasing.Add(1) > maxPendingReleases {
		s.releasing.Add(-1)
		log(fail, "is held until it lapses: too many releases wait already", cause)
		return
	}
	log(warn, "is given back in the background", cause)
	until := time.Now().Add(store.ReservationLapse)
	s.goBackground(func() {
		defer s.releasing.Add(-1)
		for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(wait):
			}
			ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
			err := s.Store.Release(ctx, r)
			cancel()
			if err == nil {
				log(min(warn, slog.LevelInfo), "is given back", nil)
				return
			}
			if time.Now().After(until) {
				log(fail, "is held until it lapses", err)
				return
			}
		}
	})
}
