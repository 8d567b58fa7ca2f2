package node_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"wb/hypervisor/templates"
	"wb/session"
	"wb/store"
)

// TestIdleTimeout: a running session nobody uses gets its idle warning at 80 % of
// idle_timeout_s and is stopped (idle_timeout) at the deadline; activity before the deadline
// pushes the deadline back and re-arms the warning.
func TestIdleTimeout(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	d := newDriver(t, "runsc", tempDir(t))
	n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_idle"))

	t.Run("no activity", func(t *testing.T) {
		t.Parallel()
		const project = "proj_idle"
		s := provision(t, st, n.Node, project, sessionOpts{idleS: 30, lifeS: 600})
		started := s.StartedAt.Time
		deadline := started.Add(30 * time.Second)

		warn := waitEvent(t, st, project, s.ID, session.EventIdleWarning, 1, time.Until(deadline))
		within(t, "idle_warning event", atMs(warn.AtMs), started.Add(24*time.Second), started.Add(24*time.Second+margin))
		got := get(t, st, project, s.ID)
		if got.State != session.Running || got.IdleWarningAt == nil {
			t.Fatalf("after the warning the session is %s with idle_warning_at %v, want running with it set", got.State, got.IdleWarningAt)
		}
		within(t, "idle_warning_at", got.IdleWarningAt.Time, started.Add(24*time.Second), started.Add(24*time.Second+margin))

		end, seen := waitState(t, st, project, s.ID, time.Until(deadline)+margin+5*time.Second, session.Stopped, session.Failed, session.Expired)
		checkEnded(t, end, session.Stopped, session.IdleTimeout)
		within(t, "stopped_at", end.StoppedAt.Time, deadline, deadline.Add(margin))
		within(t, "stopped state observed", seen, deadline, deadline.Add(margin+poll))
		if want := []string{session.EventPending, session.EventProvisioning, session.EventRunning, session.EventIdleWarning,
			session.EventStopping, session.EventStopped}; !slices.Equal(types(events(t, st, project, s.ID)), want) {
			t.Errorf("outbox %v, want %v", types(events(t, st, project, s.ID)), want)
		}
		if err := waitGuestGone(t, d, s.ID, 5*time.Second); err != nil {
			t.Error(err)
		}
		checkSlots(t, st, project)
	})

	t.Run("activity pushes the deadline", func(t *testing.T) {
		t.Parallel()
		const project = "proj_idle_act"
		s := provision(t, st, n.Node, project, sessionOpts{idleS: 30, lifeS: 600})
		started := s.StartedAt.Time
		first := started.Add(30 * time.Second)

		// Let the warning fire, then use the session before the deadline.
		waitEvent(t, st, project, s.ID, session.EventIdleWarning, 1, time.Until(first))
		sleepUntil(started.Add(26 * time.Second))
		before := time.Now()
		res, err := execIn(ctxT(t, 30*time.Second), n.Node, s, "echo hi")
		after := time.Now()
		if err != nil || res.ExitCode != 0 || res.Stdout != "hi\n" {
			t.Fatalf("exec: %+v, %v", res, err)
		}
		if after.After(first) {
			t.Fatalf("the exec ended %v after the first deadline; too late to test the push", after.Sub(first))
		}
		if got := get(t, st, project, s.ID); got.IdleWarningAt != nil {
			t.Errorf("idle_warning_at is still %v after activity; the warning should be re-armed", got.IdleWarningAt)
		}

		sleepUntil(first.Add(margin + 500*time.Millisecond))
		if got := get(t, st, project, s.ID); got.State != session.Running {
			t.Fatalf("the session is %s %s at the first deadline + %v despite activity at %+.1fs", got.State, reasonOf(got),
				margin+500*time.Millisecond, before.Sub(started).Seconds())
		}

		warn := waitEvent(t, st, project, s.ID, session.EventIdleWarning, 2, time.Until(after.Add(30*time.Second)))
		within(t, "second idle_warning event", atMs(warn.AtMs), before.Add(24*time.Second), after.Add(24*time.Second+margin))
		end, _ := waitState(t, st, project, s.ID, time.Until(after.Add(30*time.Second))+margin+5*time.Second, session.Stopped, session.Failed, session.Expired)
		checkEnded(t, end, session.Stopped, session.IdleTimeout)
		within(t, "stopped_at", end.StoppedAt.Time, before.Add(30*time.Second), after.Add(30*time.Second+margin))
		if err := waitGuestGone(t, d, s.ID, 5*time.Second); err != nil {
			t.Error(err)
		}
		checkSlots(t, st, project)
	})
}

// TestMaxLifetime: a session kept busy never idles out, gets its lifetime warning at 90 % of
// max_lifetime_s and expires (max_lifetime) at started_at + max_lifetime_s.
func TestMaxLifetime(t *testing.T) {
	t.Parallel()
	const project = "proj_life"
	st, _ := newStore(t)
	d := newDriver(t, "runsc", tempDir(t))
	n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_life"))
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 30, lifeS: 60})
	started := s.StartedAt.Time
	expiry := started.Add(60 * time.Second)
	if s.ExpiresAt == nil || !s.ExpiresAt.Equal(expiry) {
		t.Errorf("expires_at %v, want %v", s.ExpiresAt, expiry)
	}

	// Activity every 3 s until the session ends.
	ctx, stopBusy := context.WithCancel(context.Background())
	busy := make(chan int)
	go func() {
		execs := 0
		defer func() { busy <- execs }()
		for ctx.Err() == nil {
			ectx, cancel := context.WithTimeout(ctx, 20*time.Second)
			if _, err := execIn(ectx, n.Node, s, "true"); err == nil {
				execs++
			}
			cancel()
			select {
			case <-ctx.Done():
			case <-time.After(3 * time.Second):
			}
		}
	}()
	var execs int
	defer func() {
		if stopBusy != nil {
			stopBusy()
			<-busy
		}
	}()

	warn := waitEvent(t, st, project, s.ID, session.EventLifetimeWarning, 1, time.Until(expiry))
	within(t, "lifetime_warning event", atMs(warn.AtMs), started.Add(54*time.Second), started.Add(54*time.Second+margin))
	if got := get(t, st, project, s.ID); got.LifetimeWarningAt == nil {
		t.Errorf("lifetime_warning_at not set after the warning (session %s)", got.State)
	}

	end, seen := waitState(t, st, project, s.ID, time.Until(expiry)+margin+5*time.Second, session.Stopped, session.Failed, session.Expired)
	stopBusy()
	execs, stopBusy = <-busy, nil
	checkEnded(t, end, session.Expired, session.MaxLifetime)
	within(t, "stopped_at", end.StoppedAt.Time, expiry, expiry.Add(margin))
	within(t, "expired state observed", seen, expiry, expiry.Add(margin+poll))
	if execs < 15 {
		t.Errorf("only %d execs succeeded in the session's minute; the test wanted one every 3 s", execs)
	}
	evs := events(t, st, project, s.ID)
	if len(eventsOf(evs, session.EventIdleWarning)) != 0 {
		t.Errorf("an idle warning fired although the session was busy: %v", types(evs))
	}
	if want := []string{session.EventPending, session.EventProvisioning, session.EventRunning, session.EventLifetimeWarning,
		session.EventStopping, session.EventExpired}; !slices.Equal(types(evs), want) {
		t.Errorf("outbox %v, want %v", types(evs), want)
	}
	if err := waitGuestGone(t, d, s.ID, 5*time.Second); err != nil {
		t.Error(err)
	}
	checkSlots(t, st, project)
}

// TestStartFailure: a session whose template digest is not the node's fails with
// start_failure and releases its slot.
func TestStartFailure(t *testing.T) {
	t.Parallel()
	const project = "proj_startfail"
	st, _ := newStore(t)
	d := newDriver(t, "runsc", tempDir(t))
	n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_startfail"))
	s := placed(t, st, project, n.Info.ID, sessionOpts{idleS: 30, lifeS: 60,
		template: templates.Base + "@sha256:0000000000000000000000000000000000000000000000000000000000000000"})
	if err := n.Provision(ctxT(t, time.Minute), n.Info, s); err == nil {
		t.Error("Provision of a template with a foreign digest succeeded")
	}
	end, _ := waitState(t, st, project, s.ID, 5*time.Second, session.Failed, session.Stopped, session.Expired, session.Running)
	checkEnded(t, end, session.Failed, session.StartFailure)
	if want := []string{session.EventPending, session.EventProvisioning, session.EventFailed}; !slices.Equal(types(events(t, st, project, s.ID)), want) {
		t.Errorf("outbox %v, want %v", types(events(t, st, project, s.ID)), want)
	}
	checkSlots(t, st, project)
	ids, err := d.List(ctxT(t, 10*time.Second))
	if err != nil || len(ids) != 0 {
		t.Errorf("guests left after a start failure: %v (%v)", ids, err)
	}
}

func checkEnded(t testing.TB, s *session.Session, state session.State, reason session.Reason) {
	t.Helper()
	if s.State != state || s.StateReason == nil || *s.StateReason != reason {
		t.Fatalf("session %s ended %s %s, want %s (%s)", s.ID, s.State, reasonOf(s), state, reason)
	}
	if s.StoppedAt == nil {
		t.Fatalf("session %s is %s without stopped_at", s.ID, s.State)
	}
}

// checkSlots: the project holds no concurrency slot.
func checkSlots(t testing.TB, st *store.Store, project string) {
	t.Helper()
	n, err := st.ActiveCount(ctxT(t, 5*time.Second), project)
	if err != nil || n != 0 {
		t.Errorf("project %s holds %d slots (%v), want 0", project, n, err)
	}
}
