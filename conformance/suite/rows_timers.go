package suite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"wb/client"
)

// timerSlack is how far from its due time a timer may fire or a warning show: the node's
// timer tick and the API's staleness.
const timerSlack = 5 * time.Second

// stopSlack is how far past its due time a timer's stop may show as stopped_at, which is set
// when the guest has been torn down and its usage metered: timerSlack and the teardown, which
// took seconds on a loaded host (a runc kill once 2.5 s, a final meter's read up to 1 s).
const stopSlack = timerSlack + 10*time.Second

func idleTimeout(t Timers) time.Duration {
	return time.Duration(t.IdleTimeoutS)*time.Second + 4*time.Minute
}
func lifetimeTimeout(t Timers) time.Duration {
	return time.Duration(t.MaxLifetimeS)*time.Second + 4*time.Minute
}

// timerFixture is a session left to a timer: when its warning showed and how it ended.
type timerFixture struct {
	id            string
	running       *client.Session
	warnedAt      *client.Time // idle_warning_at or lifetime_warning_at as the session showed it
	ended         *client.Session
	lived         time.Duration // from started_at (lifetime) or the last activity (idle) to stopped_at
	usageAfter    string
	usageAfterErr error
}

// idleSession is a tier-2 session with the mode's idle timeout, left alone until it stops.
func idleSession(ctx context.Context, e *Env) (*timerFixture, error) {
	return shared(ctx, e, "idle", func(ctx context.Context, e *Env) (*timerFixture, error) {
		s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2, IdleTimeoutS: e.Timers.IdleTimeoutS, MaxLifetimeS: 3 * e.Timers.MaxLifetimeS})
		if err != nil {
			return nil, err
		}
		f := &timerFixture{id: s.ID, running: s}
		f.ended, err = e.WaitSession(ctx, s.ID, "ended by its idle timeout", func(s *client.Session) (bool, error) {
			if f.warnedAt == nil && s.IdleWarningAt != nil {
				f.warnedAt = s.IdleWarningAt
			}
			return s.State.Terminal(), nil
		})
		if err != nil {
			return nil, err
		}
		if f.ended.StoppedAt != nil {
			f.lived = f.ended.StoppedAt.Sub(lastActivity(f.ended))
		}
		f.usageAfter, f.usageAfterErr = e.flatUsage(ctx, s.ID)
		return f, nil
	})
}

// expiredSession is a tier-2 session with the mode's lifetime, kept busy (an exec every few
// seconds, which must not extend it) until it ends.
func expiredSession(ctx context.Context, e *Env) (*timerFixture, error) {
	return shared(ctx, e, "lifetime", func(ctx context.Context, e *Env) (*timerFixture, error) {
		s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2, IdleTimeoutS: 7200, MaxLifetimeS: e.Timers.MaxLifetimeS})
		if err != nil {
			return nil, err
		}
		f := &timerFixture{id: s.ID, running: s}
		lastExec := time.Now()
		f.ended, err = e.WaitSession(ctx, s.ID, "expired", func(s *client.Session) (bool, error) {
			if f.warnedAt == nil && s.LifetimeWarningAt != nil {
				f.warnedAt = s.LifetimeWarningAt
			}
			if s.State == "running" && time.Since(lastExec) > 5*time.Second {
				lastExec = time.Now()
				_, _ = e.C.Exec(ctx, s.ID, client.ExecRequest{Command: "true"}) // activity; may race the expiry
			}
			return s.State.Terminal(), nil
		})
		if err != nil {
			return nil, err
		}
		if f.ended.StoppedAt != nil && f.ended.StartedAt != nil {
			f.lived = f.ended.StoppedAt.Sub(f.ended.StartedAt.Time)
		}
		f.usageAfter, f.usageAfterErr = e.flatUsage(ctx, s.ID)
		return f, nil
	})
}

func lastActivity(s *client.Session) time.Time {
	t := s.StartedAt.Time
	if s.LastActivityAt != nil && s.LastActivityAt.After(t) {
		t = s.LastActivityAt.Time
	}
	return t
}

// near reports whether got is within timerSlack of want (and not before it by more than 1 s).
func near(got, want time.Time) bool {
	return !got.Before(want.Add(-time.Second)) && !got.After(want.Add(timerSlack))
}

func keptAliveTimeout(t Timers) time.Duration {
	return time.Duration(t.IdleTimeoutS)*time.Second*3/2 + 4*time.Minute
}

// keptAlive makes a session with the mode's idle timeout and does one kind of activity every
// third of it, for one and a half times it: the session must still run.
func keptAlive(ctx context.Context, e *Env, kind string) (string, error) {
	idle := time.Duration(e.Timers.IdleTimeoutS) * time.Second
	s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2, IdleTimeoutS: e.Timers.IdleTimeoutS})
	if err != nil {
		return "", err
	}
	act := map[string]func() error{
		"exec": func() error { _, err := e.Sh(ctx, s.ID, "true"); return err },
		"file PUT": func() error {
			return e.C.UploadFile(ctx, s.ID, "/workspace/t", strings.NewReader("x"))
		},
		"run": func() error {
			_, err := e.C.CreateRun(ctx, client.CreateRunRequest{SessionID: s.ID, Command: "true"})
			return err
		},
	}[kind]
	end := time.Now().Add(idle * 3 / 2)
	for time.Now().Before(end) {
		if err := sleepCtx(ctx, idle/3); err != nil {
			return "", err
		}
		if err := act(); err != nil {
			return "", fmt.Errorf("%s in a session kept alive by it: %w", kind, err)
		}
	}
	got, err := e.C.GetSession(ctx, s.ID)
	if err != nil {
		return "", err
	}
	saw := fmt.Sprintf("%s every %s: %s after %s", kind, idle/3, got.State, time.Since(got.StartedAt.Time).Round(time.Second))
	if got.State != "running" {
		return saw, fmt.Errorf("%s did not reset the idle timer: %s (%s)", kind, got.State, deref(got.StateReason))
	}
	return saw, nil
}

// defaultsSession is a session created with no timers: the defaults.
func defaultsSession(ctx context.Context, e *Env) (*client.Session, error) {
	return shared(ctx, e, "defaults", func(ctx context.Context, e *Env) (*client.Session, error) {
		return e.CreateSession(ctx, client.CreateSessionRequest{Tier: 2})
	})
}

// refused checks that a create with req is refused 400 naming param.
func refused(ctx context.Context, e *Env, req client.CreateSessionRequest, param string) (string, error) {
	if req.EndUserID == "" {
		req.EndUserID = e.Tag()
	}
	s, err := e.C.CreateSession(ctx, req)
	if err == nil {
		e.tracker().add(&e.tracker().sessions, s.ID)
		return "accepted", fmt.Errorf("a create with %s out of range was accepted", param)
	}
	a := apiErr(err)
	if a == nil {
		return "", err
	}
	saw := fmt.Sprintf("%d %s param %s", a.Status, a.Code, a.Param)
	if a.Status != 400 || a.Param != param {
		return saw, fmt.Errorf("want 400 naming param %s", param)
	}
	return saw, nil
}

func timerRows() []Row {
	const tt = "Timeouts"
	return []Row{
		{Seed: "000", Table: tt, Row: "idle_timeout_s | Default 300 | Range 30 – 7200", Check: func(ctx context.Context, e *Env) (string, error) {
			d, err := defaultsSession(ctx, e)
			if err != nil {
				return "", err
			}
			lo, err1 := refused(ctx, e, client.CreateSessionRequest{Tier: 2, IdleTimeoutS: 29}, "idle_timeout_s")
			hi, err2 := refused(ctx, e, client.CreateSessionRequest{Tier: 2, IdleTimeoutS: 7201}, "idle_timeout_s")
			saw := fmt.Sprintf("default %d; 29 → %s; 7201 → %s", d.IdleTimeoutS, lo, hi)
			if d.IdleTimeoutS != 300 {
				err1 = errors.Join(err1, errors.New("want the default 300"))
			}
			return saw, errors.Join(err1, err2)
		}},
		{Seed: "000", Table: tt, Row: "max_lifetime_s | Default 3600 | Range 60 – 86400 (tier dependent)", Check: func(ctx context.Context, e *Env) (string, error) {
			d, err := defaultsSession(ctx, e)
			if err != nil {
				return "", err
			}
			lo, err1 := refused(ctx, e, client.CreateSessionRequest{Tier: 2, MaxLifetimeS: 59}, "max_lifetime_s")
			t1, err2 := refused(ctx, e, client.CreateSessionRequest{Tier: 1, MaxLifetimeS: 3601}, "max_lifetime_s")
			hi, err3 := refused(ctx, e, client.CreateSessionRequest{Tier: 4, MaxLifetimeS: 86401}, "max_lifetime_s")
			top, err4 := e.CreateSession(ctx, client.CreateSessionRequest{Tier: 4, MaxLifetimeS: 86400})
			if err4 == nil {
				_, err4 = e.C.DeleteSession(ctx, top.ID)
			}
			saw := fmt.Sprintf("default %d; 59 → %s; tier 1 3601 → %s; tier 4 86401 → %s; tier 4 86400 → %s", d.MaxLifetimeS, lo, t1, hi, statusOf(err4))
			if d.MaxLifetimeS != 3600 {
				err1 = errors.Join(err1, errors.New("want the default 3600"))
			}
			return saw, errors.Join(err1, err2, err3, err4)
		}},
		{Seed: "000", Table: tt, Row: "idle_timeout_s | Resets on any run, exec, filesystem call", Timeout: keptAliveTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
			kinds := []string{"exec", "file PUT", "run"}
			saws := make([]string, len(kinds))
			errs := make([]error, len(kinds))
			var wg sync.WaitGroup
			for i, kind := range kinds {
				wg.Go(func() { saws[i], errs[i] = keptAlive(ctx, e, kind) })
			}
			wg.Wait()
			return strings.Join(saws, "; "), errors.Join(errs...)
		}},
		{Seed: "000", Table: tt, Row: "idle_timeout_s | does not reset on reads (GET)", Timeout: idleTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := idleSession(ctx, e)
			if err != nil {
				return "", err
			}
			// The fixture read the session at least once a second all along.
			saw := fmt.Sprintf("read every ≤ 1 s, it stopped %s after the last activity (%s)", f.lived.Round(100*time.Millisecond), deref(f.ended.StateReason))
			if deref(f.ended.StateReason) != "idle_timeout" {
				return saw, errors.New("want it stopped by its idle timeout")
			}
			return saw, nil
		}},
		{Seed: "000", Table: "Session object", Row: "last_activity_at: follows every exec, run and file call", Check: func(ctx context.Context, e *Env) (string, error) {
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
			if err != nil {
				return "", err
			}
			var steps []string
			last := lastActivity(s)
			advanced := func(what string, act func() error) error {
				if err := sleepCtx(ctx, 1100*time.Millisecond); err != nil { // kept to the millisecond, touched at most once a second: let it show
					return err
				}
				if err := act(); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				// The object may lag the node by its flush (as usage_to_date does).
				wait, cancel := context.WithTimeout(ctx, usageSettle)
				defer cancel()
				start := time.Now()
				now := last
				err := poll(wait, func() (bool, error) {
					got, err := e.C.GetSession(wait, s.ID)
					if err != nil {
						return false, err
					}
					now = lastActivity(got)
					return now.After(last), nil
				})
				last = now
				if err != nil {
					steps = append(steps, fmt.Sprintf("%s did not move it in %s", what, usageSettle))
					return fmt.Errorf("%s did not move last_activity_at within %s", what, usageSettle)
				}
				steps = append(steps, fmt.Sprintf("%s moved it (seen in %s)", what, time.Since(start).Round(100*time.Millisecond)))
				return nil
			}
			err = errors.Join(
				advanced("exec", func() error { _, err := e.Sh(ctx, s.ID, "true"); return err }),
				advanced("file PUT", func() error {
					return e.C.UploadFile(ctx, s.ID, "/workspace/t", strings.NewReader("x"))
				}),
				advanced("run", func() error {
					_, err := e.C.CreateRun(ctx, client.CreateRunRequest{SessionID: s.ID, Command: "true"})
					return err
				}),
			)
			return strings.Join(steps, ", "), err
		}},
		{Seed: "000", Table: tt, Row: "idle_timeout_s | fires: stopped, state_reason idle_timeout", Timeout: idleTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := idleSession(ctx, e)
			if err != nil {
				return "", err
			}
			want := time.Duration(f.running.IdleTimeoutS) * time.Second
			saw := fmt.Sprintf("%s (%s) %s after the last activity (idle_timeout_s %d)", f.ended.State, deref(f.ended.StateReason), f.lived.Round(100*time.Millisecond), f.running.IdleTimeoutS)
			if f.ended.State != "stopped" || deref(f.ended.StateReason) != "idle_timeout" {
				return saw, errors.New("want stopped with state_reason idle_timeout")
			}
			if f.lived < want-time.Second || f.lived > want+stopSlack {
				return saw, fmt.Errorf("want %s (+%s)", want, stopSlack)
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "max_lifetime_s | Resets on Never: expired at started_at + max_lifetime_s", Timeout: lifetimeTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := expiredSession(ctx, e)
			if err != nil {
				return "", err
			}
			want := time.Duration(f.running.MaxLifetimeS) * time.Second
			saw := fmt.Sprintf("%s (%s) %s after started_at, exec every 5 s (max_lifetime_s %d)", f.ended.State, deref(f.ended.StateReason), f.lived.Round(100*time.Millisecond), f.running.MaxLifetimeS)
			if f.ended.State != "expired" || deref(f.ended.StateReason) != "max_lifetime" {
				return saw, errors.New("want expired with state_reason max_lifetime")
			}
			if f.lived < want-time.Second || f.lived > want+stopSlack {
				return saw, fmt.Errorf("want %s (+%s)", want, stopSlack)
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "session.idle_warning fired at 80% of idle_timeout_s (on the session object)", Timeout: idleTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := idleSession(ctx, e)
			if err != nil {
				return "", err
			}
			w := f.ended.IdleWarningAt
			if w == nil {
				w = f.warnedAt
			}
			if w == nil {
				return "", errors.New("idle_warning_at never set before the idle stop")
			}
			at := w.Sub(lastActivity(f.ended))
			want := time.Duration(f.running.IdleTimeoutS) * time.Second * 8 / 10
			saw := fmt.Sprintf("idle_warning_at %s after the last activity (80%% = %s)", at.Round(100*time.Millisecond), want)
			if at < want-time.Second || at > want+timerSlack {
				return saw, errors.New("want it at 80%")
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "session.lifetime_warning fired at 90% of max_lifetime_s (on the session object)", Timeout: lifetimeTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := expiredSession(ctx, e)
			if err != nil {
				return "", err
			}
			w := f.ended.LifetimeWarningAt
			if w == nil {
				w = f.warnedAt
			}
			if w == nil {
				return "", errors.New("lifetime_warning_at never set before the expiry")
			}
			at := w.Sub(f.ended.StartedAt.Time)
			want := time.Duration(f.running.MaxLifetimeS) * time.Second * 9 / 10
			saw := fmt.Sprintf("lifetime_warning_at %s after started_at (90%% = %s)", at.Round(100*time.Millisecond), want)
			if at < want-time.Second || at > want+timerSlack {
				return saw, errors.New("want it at 90%")
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "PATCH /sessions/{id} with a new timeout, within plan limits", Check: func(ctx context.Context, e *Env) (string, error) {
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2, IdleTimeoutS: 60, MaxLifetimeS: 600})
			if err != nil {
				return "", err
			}
			p, err := e.C.UpdateSession(ctx, s.ID, client.UpdateSessionRequest{IdleTimeoutS: 900, MaxLifetimeS: 1200})
			if err != nil {
				return "", fmt.Errorf("PATCH idle_timeout_s 900, max_lifetime_s 1200: %w", err)
			}
			_, tooLong := e.C.UpdateSession(ctx, s.ID, client.UpdateSessionRequest{MaxLifetimeS: 21601})
			saw := fmt.Sprintf("idle_timeout_s %d, max_lifetime_s %d, expires_at − started_at %s; tier 2 21601 → %s",
				p.IdleTimeoutS, p.MaxLifetimeS, p.ExpiresAt.Sub(p.StartedAt.Time), statusOf(tooLong))
			switch {
			case p.IdleTimeoutS != 900 || p.MaxLifetimeS != 1200:
				return saw, errors.New("want the new timers")
			case !p.ExpiresAt.Equal(p.StartedAt.Add(1200 * time.Second)):
				return saw, errors.New("want the new lifetime counted from started_at")
			case apiStatus(tooLong) != 400:
				return saw, errors.New("want a lifetime beyond the tier refused 400")
			}
			return saw, nil
		}},
	}
}
