package suite

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"wb/client"
)

// usageSettle is how long usage_to_date may lag (API.md: at most 5 s stale), and a second.
const usageSettle = 6 * time.Second

// sleepCtx waits d or until ctx ends. The suite measures what accrues over a span of time, so
// some waits are spans, not conditions.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// sessionS answers the session's usage_to_date.session_s now.
func (e *Env) sessionS(ctx context.Context, id string) (int64, *client.Session, error) {
	s, err := e.C.GetSession(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	return s.UsageToDate.SessionS, s, nil
}

// flatUsageSpans is how many spans of usageSettle flatUsage watches at most.
const flatUsageSpans = 4

// flatUsage checks that session_s stops growing once settled: for states not billed per
// second. A first span in which it grew by at most 1 passes, as do two flat spans in a row
// after it grew: a loaded host's settler may still be settling the seconds from before the
// state changed, and the second flat span keeps one late flush from passing a state billed
// per second, which grows in every span.
func (e *Env) flatUsage(ctx context.Context, id string) (string, error) {
	if err := sleepCtx(ctx, usageSettle); err != nil {
		return "", err
	}
	a, _, err := e.sessionS(ctx, id)
	if err != nil {
		return "", err
	}
	seen := []string{fmt.Sprint(a)}
	wasFlat := false
	for span := 1; ; span++ {
		if err := sleepCtx(ctx, usageSettle); err != nil {
			return "", err
		}
		b, s, err := e.sessionS(ctx, id)
		if err != nil {
			return "", err
		}
		seen = append(seen, fmt.Sprint(b))
		saw := fmt.Sprintf("usage_to_date.session_s %s over %s %s", strings.Join(seen, " → "), time.Duration(span)*usageSettle, s.State)
		flat := b <= a+1
		switch {
		case flat && (span == 1 || wasFlat):
			return saw, nil
		case span == flatUsageSpans:
			return saw, fmt.Errorf("session_s was not flat (growth ≤ 1) for two spans of %s in a row within %d spans: billed per second", usageSettle, flatUsageSpans)
		}
		a, wasFlat = b, flat
	}
}

// pauseFixture is a tier-2 session with a file and a background process, paused (its usage
// watched while paused) and resumed.
type pauseFixture struct {
	id                   string
	paused, resumed      *client.Session
	pauseErr, resumeErr  error
	execWhilePaused      error
	pauseAgain           error
	pausedUsage          string
	pausedUsageErr       error
	resumeLatency        time.Duration
	fileAfter, pidBefore string
	pidAliveAfter        bool
}

// pausedState is what a paused guest holds in the pause rows: a file, and a process whose
// pid it prints.
const pausedState = `echo kept > /workspace/f; sleep 100000 >/dev/null 2>&1 & echo $!`

func pausedSession(ctx context.Context, e *Env) (*pauseFixture, error) {
	return shared(ctx, e, "pause", func(ctx context.Context, e *Env) (*pauseFixture, error) {
		s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
		if err != nil {
			return nil, err
		}
		f := &pauseFixture{id: s.ID}
		pid, err := e.Sh(ctx, s.ID, pausedState)
		if err != nil {
			return nil, err
		}
		f.pidBefore = strings.TrimSpace(pid)
		f.paused, f.pauseErr = e.C.PauseSession(ctx, s.ID)
		if f.pauseErr != nil {
			return f, nil
		}
		_, f.execWhilePaused = e.C.Exec(ctx, s.ID, client.ExecRequest{Command: "true"})
		_, f.pauseAgain = e.C.PauseSession(ctx, s.ID)
		f.pausedUsage, f.pausedUsageErr = e.flatUsage(ctx, s.ID)
		start := time.Now()
		f.resumed, f.resumeErr = e.C.ResumeSession(ctx, s.ID)
		f.resumeLatency = time.Since(start)
		if f.resumeErr != nil {
			return f, nil
		}
		f.fileAfter, _ = e.Sh(ctx, s.ID, "cat /workspace/f")
		alive, _ := e.Sh(ctx, s.ID, "kill -0 "+f.pidBefore+" && echo alive")
		f.pidAliveAfter = strings.TrimSpace(alive) == "alive"
		return f, nil
	})
}

// resumePause is how long resumeLatencies holds each pause: a guest paused for seconds, as
// the pause fixture's is, not one resumed at once.
const resumePause = 3 * time.Second

// resumeLatencies pauses and resumes a tier-2 session of its own n times, with a file and a
// process in it as the pause fixture has, and answers how long each :resume took to answer.
func resumeLatencies(ctx context.Context, e *Env, n int) ([]time.Duration, error) {
	s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
	if err != nil {
		return nil, err
	}
	if _, err := e.Sh(ctx, s.ID, pausedState); err != nil {
		return nil, err
	}
	var took []time.Duration
	for range n {
		if _, err := e.C.PauseSession(ctx, s.ID); err != nil {
			return nil, fmt.Errorf("pause: %w", err)
		}
		if err := sleepCtx(ctx, resumePause); err != nil {
			return nil, err
		}
		start := time.Now()
		if _, err := e.C.ResumeSession(ctx, s.ID); err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		took = append(took, time.Since(start))
	}
	return took, nil
}

// joinDurations lists ds to the millisecond, for a row's report.
func joinDurations(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Round(time.Millisecond).String()
	}
	return strings.Join(parts, ", ")
}

// deleteFixture is a running session deleted: DELETE's answer, the session once stopped, its
// usage after, and a second DELETE's answer.
type deleteFixture struct {
	id            string
	answer        *client.Session
	stopped       *client.Session
	usageAfter    string
	usageAfterErr error
	again         *client.Session
	againErr      error
}

func deletedSession(ctx context.Context, e *Env) (*deleteFixture, error) {
	return shared(ctx, e, "delete", func(ctx context.Context, e *Env) (*deleteFixture, error) {
		s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
		if err != nil {
			return nil, err
		}
		f := &deleteFixture{id: s.ID}
		if f.answer, err = e.C.DeleteSession(ctx, s.ID); err != nil {
			return nil, fmt.Errorf("DELETE a running session: %w", err)
		}
		if f.stopped, err = e.WaitState(ctx, s.ID, "stopped"); err != nil {
			return nil, err
		}
		f.usageAfter, f.usageAfterErr = e.flatUsage(ctx, s.ID)
		f.again, f.againErr = e.C.DeleteSession(ctx, s.ID)
		return f, nil
	})
}

func stateRows() []Row {
	const st = "States"
	return []Row{
		{Seed: "000", Table: st, Row: "pending | No | Admitted and queued", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := objectSession(ctx, e)
			if err != nil {
				return "", err
			}
			c := f.created
			saw := fmt.Sprintf("create answered %s, session_s %d", c.State, c.UsageToDate.SessionS)
			if c.State != "pending" || c.UsageToDate.SessionS != 0 {
				return saw, errors.New("want pending with session_s 0")
			}
			return saw, nil
		}},
		{Seed: "000", Table: st, Row: "provisioning | No | Claiming a pool instance or cold starting", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := objectSession(ctx, e)
			if err != nil {
				return "", err
			}
			saw := "states seen: " + joinStates(f.seen)
			for _, s := range f.seen {
				if s != "pending" && s != "provisioning" && s != "running" {
					return saw, fmt.Errorf("a state other than pending, provisioning, running on the way to running: %s", s)
				}
			}
			if f.startedLeak != "" {
				return saw, fmt.Errorf("started_at (billing) set while %s", f.startedLeak)
			}
			if !contains(f.seen, "provisioning") {
				saw += " (provisioning shorter than a poll)"
			}
			return saw + "; started_at null until running", nil
		}},
		{Seed: "000", Table: st, Row: "running | Yes | tierN.session_s accrues every second", Check: func(ctx context.Context, e *Env) (string, error) {
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
			if err != nil {
				return "", err
			}
			a, _, err := e.sessionS(ctx, s.ID)
			if err != nil {
				return "", err
			}
			start := time.Now()
			var b int64
			err = poll(ctx, func() (bool, error) {
				b, _, err = e.sessionS(ctx, s.ID)
				return b >= a+3, err
			})
			return fmt.Sprintf("usage_to_date.session_s %d → %d in %s", a, b, time.Since(start).Round(time.Second)), err
		}},
		{Seed: "000", Table: st, Row: "paused | Storage only | no CPU", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := pausedSession(ctx, e)
			if err != nil {
				return "", err
			}
			if f.pauseErr != nil {
				return "", fmt.Errorf("pause: %w", f.pauseErr)
			}
			saw := fmt.Sprintf("paused_at set %v; %s", f.paused.PausedAt != nil, f.pausedUsage)
			if f.paused.PausedAt == nil {
				return saw, errors.New("a paused session has no paused_at")
			}
			return saw, f.pausedUsageErr
		}},
		{Seed: "000", Table: st, Row: "snapshotting | Yes | Still running; the snapshot is taken live", Check: func(ctx context.Context, e *Env) (string, error) {
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
			if err != nil {
				return "", err
			}
			snap, err := e.C.SnapshotSession(ctx, s.ID, client.SnapshotRequest{})
			if err != nil {
				return "", fmt.Errorf("snapshot: %w", err)
			}
			e.tracker().add(&e.tracker().snapshots, snap.ID)
			after, err := e.C.GetSession(ctx, s.ID)
			if err != nil {
				return "", err
			}
			out, err := e.Sh(ctx, s.ID, "echo live")
			saw := fmt.Sprintf("snapshot %s answered %s; the session is %s after, exec answers %q", snap.ID, snap.State, after.State, strings.TrimSpace(out))
			if after.State != "running" && after.State != "snapshotting" {
				return saw, errors.New("want the session running through its snapshot")
			}
			return saw, err
		}},
		{Seed: "000", Table: st, Row: "stopping | Yes, until the final meter | Draining, teardown", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := deletedSession(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("DELETE answered %s (state_reason %s)", f.answer.State, deref(f.answer.StateReason))
			if f.answer.State != "stopping" && f.answer.State != "stopped" {
				return saw, errors.New("want stopping")
			}
			return saw, nil
		}},
		{Seed: "000", Table: st, Row: "stopped | No | Terminal, clean. Caller asked for it", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := deletedSession(ctx, e)
			if err != nil {
				return "", err
			}
			s := f.stopped
			saw := fmt.Sprintf("stopped, state_reason %s, stopped_at set %v; %s", deref(s.StateReason), s.StoppedAt != nil, f.usageAfter)
			if deref(s.StateReason) != "deleted" || s.StoppedAt == nil {
				return saw, errors.New("want state_reason deleted and stopped_at")
			}
			return saw, f.usageAfterErr
		}},
		{Seed: "000", Table: st, Row: "failed | No | Terminal, unclean (a policy kill)", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := policyKilled(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("%s (%s); %s", f.ended.State, deref(f.ended.StateReason), f.usageAfter)
			if f.ended.State != "failed" {
				return saw, errors.New("want failed")
			}
			return saw, f.usageAfterErr
		}},
		{Seed: "000", Table: st, Row: "expired | No | Terminal. Maximum lifetime reached", Timeout: lifetimeTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := expiredSession(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("%s (%s) %s after started_at; %s", f.ended.State, deref(f.ended.StateReason), f.lived, f.usageAfter)
			if f.ended.State != "expired" {
				return saw, errors.New("want expired")
			}
			return saw, f.usageAfterErr
		}},
	}
}

func transitionRows() []Row {
	const tt = "Transitions and who drives them"
	return []Row{
		{Seed: "000", Table: tt, Row: "→ pending | api-gateway after admission", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := objectSession(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("POST /v1/sessions answered %s %s", f.created.ID, f.created.State)
			if f.created.State != "pending" {
				return saw, errors.New("want pending")
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "pending → provisioning | placer | Placement decision recorded", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := objectSession(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("states %s; region %q zone %q", joinStates(f.seen), f.running.Region, deref(f.running.Zone))
			if f.running.Region == "" || deref(f.running.Zone) == "" {
				return saw, errors.New("want the placement (region and zone) recorded on the session")
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "provisioning → running | wbnode health probe", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := objectSession(ctx, e)
			if err != nil {
				return "", err
			}
			start := time.Now()
			out, err := e.Sh(ctx, f.running.ID, "echo up")
			saw := fmt.Sprintf("running with started_at %v; exec answered %q in %s", f.running.StartedAt != nil, strings.TrimSpace(out), time.Since(start).Round(time.Millisecond))
			if err == nil && f.running.StartedAt == nil {
				err = errors.New("a running session has no started_at")
			}
			return saw, err
		}},
		{Seed: "000", Table: tt, Row: "provisioning → failed | wbnode or deadline",
			Skip: "a start slower than 3× the tier's cold p95 cannot be caused through the API"},
		{Seed: "000", Table: tt, Row: "running → paused | Caller, POST :pause", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := pausedSession(ctx, e)
			if err != nil {
				return "", err
			}
			if f.pauseErr != nil {
				return "", fmt.Errorf("pause a running tier-2 session: %w", f.pauseErr)
			}
			saw := fmt.Sprintf(":pause answered %s; exec while paused: %s; :pause again: %s", f.paused.State, statusOf(f.execWhilePaused), statusOf(f.pauseAgain))
			switch {
			case f.paused.State != "paused":
				return saw, errors.New("want paused")
			case apiStatus(f.execWhilePaused) != 409 || !strings.Contains(apiErr(f.execWhilePaused).Message, "paused"):
				return saw, errors.New("want exec in a paused session refused 409 naming the state paused")
			case apiStatus(f.pauseAgain) != 409:
				return saw, errors.New("want :pause of a paused session refused 409")
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "paused → running | Caller, POST :resume", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := pausedSession(ctx, e)
			if err != nil {
				return "", err
			}
			if f.pauseErr != nil || f.resumeErr != nil {
				return "", fmt.Errorf("pause: %v; resume: %v", f.pauseErr, f.resumeErr)
			}
			saw := fmt.Sprintf(":resume answered %s %s; file %q; process %s alive %v", f.resumed.ID, f.resumed.State, strings.TrimSpace(f.fileAfter), f.pidBefore, f.pidAliveAfter)
			if f.resumed.State != "running" || f.resumed.ID != f.id || strings.TrimSpace(f.fileAfter) != "kept" || !f.pidAliveAfter {
				return saw, errors.New("want the same session running, its file and its process as before")
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "running → snapshotting → running | Caller, POST :snapshot", Check: func(ctx context.Context, e *Env) (string, error) {
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
			if err != nil {
				return "", err
			}
			snap, err := e.Snapshot(ctx, s.ID, false)
			if err != nil {
				return "", err
			}
			after, err := e.WaitState(ctx, s.ID, "running")
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("snapshot %s %s of %s; the session is %s", snap.ID, snap.State, snap.SessionID, after.State), nil
		}},
		{Seed: "000", Table: tt, Row: "running → stopping | Caller DELETE (reason recorded)", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := deletedSession(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("DELETE answered %s, state_reason %s", f.answer.State, deref(f.stopped.StateReason))
			if deref(f.stopped.StateReason) != "deleted" {
				return saw, errors.New("want state_reason deleted")
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "running → stopping | idle timeout, max lifetime (reason recorded)", Timeout: lifetimeTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
			idle, err := idleSession(ctx, e)
			if err != nil {
				return "", err
			}
			exp, err := expiredSession(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("idle: %s (%s); lifetime: %s (%s)", idle.ended.State, deref(idle.ended.StateReason), exp.ended.State, deref(exp.ended.StateReason))
			if deref(idle.ended.StateReason) != "idle_timeout" || deref(exp.ended.StateReason) != "max_lifetime" {
				return saw, errors.New("want state_reason idle_timeout and max_lifetime")
			}
			return saw, nil
		}},
		{Seed: "000", Table: tt, Row: "running → stopping | eviction, policy kill, spend cap (reason recorded; eviction not checked: it cannot be caused through the API)",
			Serial: true, Timeout: func(t Timers) time.Duration { return spendCapTimeout(t) + DefaultRowTimeout }, Check: func(ctx context.Context, e *Env) (string, error) {
				// The sessions of the failure table's spend-cap and policy-kill rows.
				capped, err := spendCapped(ctx, e)
				if err != nil {
					return "", err
				}
				killed, err := policyKilled(ctx, e)
				if err != nil {
					return "", err
				}
				saw := fmt.Sprintf("spend cap: %s (%s); policy kill: %s (%s, rule %s); eviction: not checked",
					joinStates(capped.seen), deref(capped.end.StateReason), killed.ended.State, deref(killed.ended.StateReason), deref(killed.ended.Rule))
				switch {
				case capped.seen[0] != "running" || capped.end.State != "stopped" || deref(capped.end.StateReason) != "spend_cap":
					return saw, errors.New("want a running session stopped by the cap, state_reason spend_cap")
				case killed.ended.State != "failed" || deref(killed.ended.StateReason) != "policy_violation" || deref(killed.ended.Rule) != killRule:
					return saw, errors.New("want a policy kill failed, state_reason policy_violation, with the rule")
				}
				return saw, nil
			}},
		{Seed: "000", Table: tt, Row: "stopping → stopped / failed | wbnode | Final usage flush", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := deletedSession(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("stopped %s after the DELETE; DELETE again answered %s (%s)", f.stopped.StoppedAt.Sub(f.answer.CreatedAt.Time).Round(time.Millisecond), stateOf(f.again), statusOf(f.againErr))
			if f.againErr != nil || f.again.State != "stopped" {
				return saw, errors.New("want a second DELETE to answer the stopped session as it is")
			}
			return saw, nil
		}},
	}
}

func pauseRows() []Row {
	pauseTier := func(tier int) Row {
		return Row{Seed: "000", Table: "Pause limits", Row: fmt.Sprintf("tier %d: pause and resume allowed", tier), Check: func(ctx context.Context, e *Env) (string, error) {
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: tier})
			if err != nil {
				return "", err
			}
			p, err := e.C.PauseSession(ctx, s.ID)
			if err != nil {
				return "", fmt.Errorf("pause a tier %d session: %w", tier, err)
			}
			r, err := e.C.ResumeSession(ctx, s.ID)
			if err != nil {
				return "", fmt.Errorf("resume a tier %d session: %w", tier, err)
			}
			saw := fmt.Sprintf("tier %d: :pause → %s, :resume → %s", tier, p.State, r.State)
			if p.State != "paused" || r.State != "running" {
				return saw, errors.New("want paused, then running")
			}
			return saw, nil
		}}
	}
	return []Row{
		{Seed: "000", Table: "Pause limits", Row: "tier 1: pause refused (Tiers 2–4 only)", Check: func(ctx context.Context, e *Env) (string, error) {
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 1})
			if err != nil {
				return "", err
			}
			_, err = e.C.PauseSession(ctx, s.ID)
			saw := "tier 1 :pause → " + statusOf(err)
			if apiStatus(err) != 409 {
				return saw, errors.New("want 409")
			}
			return saw, nil
		}},
		pauseTier(2), pauseTier(3), pauseTier(4),
		{Seed: "000", Table: "Pause limits", Row: "Maximum duration | 1 hour, then auto-stopped", Long: true,
			Timeout: func(Timers) time.Duration { return 70 * time.Minute },
			Check: func(ctx context.Context, e *Env) (string, error) {
				s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2, IdleTimeoutS: 7200, MaxLifetimeS: 21600})
				if err != nil {
					return "", err
				}
				p, err := e.C.PauseSession(ctx, s.ID)
				if err != nil {
					return "", fmt.Errorf("pause: %w", err)
				}
				end, err := e.WaitSession(ctx, s.ID, "stopped", func(s *client.Session) (bool, error) { return s.State.Terminal(), nil })
				if err != nil {
					return "", err
				}
				held := end.StoppedAt.Sub(p.PausedAt.Time)
				saw := fmt.Sprintf("paused %s, then %s (%s)", held.Round(time.Second), end.State, deref(end.StateReason))
				if end.State != "stopped" || held < time.Hour-5*time.Second || held > time.Hour+2*time.Minute {
					return saw, errors.New("want stopped about an hour after the pause")
				}
				return saw, nil
			}},
		{Seed: "000", Table: "Pause and resume", Row: "Resume latency | 150 ms – 1 s", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := pausedSession(ctx, e)
			if err != nil {
				return "", err
			}
			if f.resumeErr != nil {
				return "", f.resumeErr
			}
			took := []time.Duration{f.resumeLatency}
			if f.resumeLatency > time.Second {
				// One answer past the bound may be the host's moment (a loaded one runs a
				// runc process in seconds), not the platform's: two more, and the median.
				more, err := resumeLatencies(ctx, e, 2)
				if err != nil {
					return "", err
				}
				took = append(took, more...)
			}
			sorted := slices.Sorted(slices.Values(took))
			median := sorted[len(sorted)/2]
			saw := fmt.Sprintf(":resume answered running in %s", median.Round(time.Millisecond))
			if len(took) > 1 {
				saw += fmt.Sprintf(" (the median of %d, in the order taken: %s)", len(took), joinDurations(took))
			}
			if median > time.Second {
				return saw, errors.New("want at most 1 s")
			}
			return saw, nil
		}},
		{Seed: "000", Table: "Pause and resume", Row: "Same session ID | pause → resume: Yes", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := pausedSession(ctx, e)
			if err != nil {
				return "", err
			}
			if f.resumeErr != nil {
				return "", f.resumeErr
			}
			saw := fmt.Sprintf("paused %s, resumed %s", f.id, f.resumed.ID)
			if f.resumed.ID != f.id {
				return saw, errors.New("want the same id")
			}
			return saw, nil
		}},
		{Seed: "000", Table: "Pause and resume", Row: "Holds host capacity; Survives host maintenance",
			Skip: "host capacity and maintenance are not visible through the API"},
	}
}

func joinStates(ss []client.SessionState) string {
	return strings.Join(stateNames(ss), " → ")
}

func contains(ss []client.SessionState, s client.SessionState) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// statusOf says how a call ended: "ok", or the API error's status and code.
func statusOf(err error) string {
	if err == nil {
		return "ok"
	}
	if e := apiErr(err); e != nil {
		return fmt.Sprintf("%d %s", e.Status, e.Code)
	}
	return err.Error()
}

func stateOf(s *client.Session) string {
	if s == nil {
		return "-"
	}
	return string(s.State)
}
