package suite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"wb/client"
	"wb/desktop"
)

// billingFixture is a session that ran, paused, ran again and was deleted, with its settled
// usage line (GET /v1/usage) and the spans the client measured.
type billingFixture struct {
	final        *client.Session
	line         client.UsageLine
	provisioning time.Duration // created_at → started_at
	// The final meter comes between the DELETE and stopped_at (which the node records once
	// the guest is killed, a second or more later on a busy machine): what is billed lies
	// between the running time up to each, less the pause. The pause begins during the
	// :pause request and ends during the :resume request (a loaded host took seconds to thaw
	// a guest, then to journal and record it): it lies between the two requests' spans.
	runningToDelete  time.Duration // started_at → the DELETE, less the longest pause
	runningToStopped time.Duration // started_at → stopped_at, less the shortest pause
	pausedMin        time.Duration // the :pause's answer → the :resume's request
	pausedMax        time.Duration // the :pause's request → the :resume's answer
	settleErr        error
}

const billingSpan = 4 * time.Second

func billedSession(ctx context.Context, e *Env) (*billingFixture, error) {
	return shared(ctx, e, "billing", func(ctx context.Context, e *Env) (*billingFixture, error) {
		s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
		if err != nil {
			return nil, err
		}
		if err := sleepCtx(ctx, billingSpan); err != nil {
			return nil, err
		}
		pauseSent := time.Now()
		p, err := e.C.PauseSession(ctx, s.ID)
		if err != nil {
			return nil, fmt.Errorf("pause: %w", err)
		}
		pauseAnswered := time.Now()
		if err := sleepCtx(ctx, billingSpan); err != nil {
			return nil, err
		}
		resumeSent := time.Now()
		if _, err := e.C.ResumeSession(ctx, s.ID); err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		resumed := time.Now()
		if err := sleepCtx(ctx, billingSpan/2); err != nil {
			return nil, err
		}
		deleted := time.Now()
		if _, err := e.C.DeleteSession(ctx, s.ID); err != nil {
			return nil, fmt.Errorf("delete: %w", err)
		}
		final, err := e.WaitState(ctx, s.ID, "stopped")
		if err != nil {
			return nil, err
		}
		if final.StartedAt == nil || final.StoppedAt == nil || p.PausedAt == nil {
			return nil, fmt.Errorf("a stopped session lacks started_at, stopped_at or (when paused) paused_at: %+v", final)
		}
		f := &billingFixture{final: final, provisioning: final.StartedAt.Sub(final.CreatedAt.Time),
			pausedMin: resumeSent.Sub(pauseAnswered), pausedMax: resumed.Sub(pauseSent)}
		f.runningToStopped = final.StoppedAt.Sub(final.StartedAt.Time) - f.pausedMin
		f.runningToDelete = deleted.Sub(final.StartedAt.Time) - f.pausedMax
		// Settled usage arrives within seconds of the final meter, and the session's
		// usage_to_date with it: the settler adds both, so a session read when it stopped may
		// not have the last record yet (a cold make test read 8 s there, then 9 s settled).
		settle, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		f.settleErr = poll(settle, func() (bool, error) {
			u, err := e.C.GetUsage(settle, client.UsageRequest{GroupBy: "session"})
			if err != nil {
				return false, err
			}
			for _, l := range u.Data {
				if l.SessionID == s.ID {
					f.line = l
				}
			}
			if f.line.SessionS == 0 || f.line.PausedS == 0 {
				return false, nil
			}
			cur, err := e.C.GetSession(settle, s.ID)
			if err != nil {
				return false, err
			}
			f.final = cur
			return f.line.SessionS == cur.UsageToDate.SessionS, nil
		})
		return f, nil
	})
}

// between reports whether billed seconds n lie between lo and hi, to within 2 s.
func between(n int64, lo, hi time.Duration) bool {
	return float64(n) >= lo.Seconds()-2 && float64(n) <= hi.Seconds()+2
}

func billingRows() []Row {
	const bt = "Billing per state"
	get := func(ctx context.Context, e *Env) (*billingFixture, string, error) {
		f, err := billedSession(ctx, e)
		if err != nil {
			return nil, "", err
		}
		saw := fmt.Sprintf("GET /v1/usage: session_s %d, paused_s %d, cost %d µUSD; running %s to the DELETE, %s to stopped_at, paused %s to %s, provisioning %s",
			f.line.SessionS, f.line.PausedS, f.line.CostMicroUSD, f.runningToDelete.Round(100*time.Millisecond), f.runningToStopped.Round(100*time.Millisecond),
			f.pausedMin.Round(100*time.Millisecond), f.pausedMax.Round(100*time.Millisecond), f.provisioning.Round(time.Millisecond))
		if f.settleErr != nil {
			return f, saw, fmt.Errorf("no settled usage line for the session matching its usage_to_date (%d): %w", f.final.UsageToDate.SessionS, f.settleErr)
		}
		return f, saw, nil
	}
	return []Row{
		{Seed: "000", Table: bt, Row: "running | Yes | session_s accrues every second", Check: func(ctx context.Context, e *Env) (string, error) {
			f, saw, err := get(ctx, e)
			if err == nil && !between(f.line.SessionS, f.runningToDelete, f.runningToStopped) {
				err = errors.New("want session_s = the running time up to the final meter, which is between the DELETE and stopped_at (±2 s)")
			}
			return saw, err
		}},
		{Seed: "000", Table: bt, Row: "paused | Storage only | billed as paused_gib_month, not session_s", Check: func(ctx context.Context, e *Env) (string, error) {
			f, saw, err := get(ctx, e)
			if err == nil && (!between(f.line.PausedS, f.pausedMin, f.pausedMax) || float64(f.line.SessionS) > (f.runningToStopped+2*time.Second).Seconds()) {
				err = errors.New("want paused_s = the pause, between the two requests' spans (±2 s), and the pause left out of session_s")
			}
			return saw, err
		}},
		{Seed: "000", Table: bt, Row: "pending, provisioning | No | billing begins when the session reports running", Check: func(ctx context.Context, e *Env) (string, error) {
			f, saw, err := get(ctx, e)
			if err == nil && float64(f.line.SessionS) > (f.final.StoppedAt.Sub(f.final.StartedAt.Time)+2*time.Second).Seconds() {
				err = errors.New("session_s exceeds started_at → stopped_at: the start was billed")
			}
			return saw, err
		}},
		{Seed: "000", Table: bt, Row: "stopped | No | usage_to_date equals the settled figure and stays", Check: func(ctx context.Context, e *Env) (string, error) {
			f, saw, err := get(ctx, e)
			if err != nil {
				return saw, err
			}
			flat, err := e.flatUsage(ctx, f.final.ID)
			saw += "; " + flat
			if err == nil && f.final.UsageToDate.SessionS != f.line.SessionS {
				err = fmt.Errorf("usage_to_date.session_s %d, settled %d", f.final.UsageToDate.SessionS, f.line.SessionS)
			}
			return saw, err
		}},
	}
}

// policyFixture is a session killed by its runtime policy.
type policyFixture struct {
	refused       error
	ended         *client.Session
	usageAfter    string
	usageAfterErr error
}

const killRule = "conformance_no_wget"

func policyKilled(ctx context.Context, e *Env) (*policyFixture, error) {
	return shared(ctx, e, "policy", func(ctx context.Context, e *Env) (*policyFixture, error) {
		pol, err := e.C.PutPolicy(ctx, "conformance_kill", `package wb.runtime

kill contains "`+killRule+`" if {
	input.type == "exec"
	some arg in input.argv
	contains(arg, "wget")
}
`)
		if err != nil {
			return nil, fmt.Errorf("push the runtime policy: %w", err)
		}
		s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2, PolicyID: pol.ID})
		if err != nil {
			return nil, err
		}
		if _, err := e.Sh(ctx, s.ID, "echo allowed"); err != nil {
			return nil, fmt.Errorf("a command the policy allows: %w", err)
		}
		f := &policyFixture{}
		// Refused before it runs: nothing is dialled.
		_, f.refused = e.C.Exec(ctx, s.ID, client.ExecRequest{Command: "wget http://example.com/"})
		f.ended, err = e.WaitSession(ctx, s.ID, "ended", func(s *client.Session) (bool, error) { return s.State.Terminal(), nil })
		if err != nil {
			return nil, err
		}
		f.usageAfter, f.usageAfterErr = e.flatUsage(ctx, s.ID)
		return f, nil
	})
}

func failureRows() []Row {
	const ft = "Failure semantics"
	return []Row{
		{Seed: "000", Table: ft, Row: "Cold start exceeded the deadline | failed, provision_timeout",
			Skip: "a start slower than 3× the tier's cold p95 cannot be caused through the API"},
		{Seed: "000", Table: ft, Row: "Host died while running | failed, host_failure",
			Skip: "a host cannot be killed through the API"},
		{Seed: "000", Table: ft, Row: "Guest OOM | failed | reason oom", Check: func(ctx context.Context, e *Env) (string, error) {
			mem := 128
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2, Resources: &client.ResourceRequest{MemoryMiB: &mem}})
			if err != nil {
				return "", err
			}
			// dd's buffer is bs bytes, filled from /dev/zero: twice the session's memory.
			res, execErr := e.C.Exec(ctx, s.ID, client.ExecRequest{Command: "dd if=/dev/zero of=/dev/null bs=256M count=1"})
			end, err := e.WaitSession(ctx, s.ID, "ended", func(s *client.Session) (bool, error) { return s.State.Terminal(), nil })
			if err != nil {
				return "", err
			}
			exit := statusOf(execErr)
			if res != nil {
				exit = fmt.Sprintf("exit %d", res.ExitCode)
			}
			saw := fmt.Sprintf("256 MiB in a 128 MiB session: exec %s; session %s (%s)", exit, end.State, deref(end.StateReason))
			if end.State != "failed" || deref(end.StateReason) != "oom" {
				return saw, errors.New("want failed with state_reason oom")
			}
			return saw, nil
		}},
		{Seed: "000", Table: ft, Row: "Policy violation | failed | policy_violation, with the rule", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := policyKilled(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("exec answered %s; session %s (%s, rule %s); %s", statusOf(f.refused), f.ended.State, deref(f.ended.StateReason), deref(f.ended.Rule), f.usageAfter)
			switch {
			case apiStatus(f.refused) != 403 || apiErr(f.refused).Code != "policy_violation" || !strings.Contains(apiErr(f.refused).Message, killRule):
				return saw, errors.New("want the exec refused 403 policy_violation naming the rule")
			case f.ended.State != "failed" || deref(f.ended.StateReason) != "policy_violation" || deref(f.ended.Rule) != killRule:
				return saw, errors.New("want failed, policy_violation, with the rule")
			}
			return saw, f.usageAfterErr
		}},
		{Seed: "000", Table: ft, Row: "Spend cap breached | stopping → stopped | Up to the stop", Serial: true, Timeout: spendCapTimeout, Check: spendCapRow},
		{Seed: "000", Table: ft, Row: "Maximum lifetime reached | expired | Up to expiry", Timeout: lifetimeTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := expiredSession(ctx, e)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("%s (%s); %s", f.ended.State, deref(f.ended.StateReason), f.usageAfter)
			if f.ended.State != "expired" || deref(f.ended.StateReason) != "max_lifetime" {
				return saw, errors.New("want expired with state_reason max_lifetime")
			}
			return saw, f.usageAfterErr
		}},
		{Seed: "000", Table: ft, Row: "Client disconnected | Unchanged | Continues", Check: func(ctx context.Context, e *Env) (string, error) {
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
			if err != nil {
				return "", err
			}
			sctx, cancel := context.WithCancel(ctx)
			var first string
			for ev, err := range e.C.ExecStream(sctx, s.ID, client.ExecRequest{Command: "echo started; sleep 30"}) {
				if err != nil {
					cancel()
					return "", fmt.Errorf("streamed exec: %w", err)
				}
				first = strings.TrimSpace(string(ev.Data))
				break // closes the stream mid-command
			}
			cancel()
			after, err := e.C.GetSession(ctx, s.ID)
			if err != nil {
				return "", err
			}
			out, err := e.Sh(ctx, s.ID, "echo still")
			saw := fmt.Sprintf("stream closed after %q; the session is %s, exec answers %q", first, after.State, strings.TrimSpace(out))
			if err == nil && after.State != "running" {
				err = errors.New("want the session still running")
			}
			return saw, err
		}},
	}
}

// spendCapCushion is how far above this month's spend the row sets the cap: about ten seconds
// of a small tier-2 session.
const spendCapCushion = 300

// spendCapTimeout bounds the serial rows that share the spend-cap fixture: a session run
// until the cap stops it, and a desktop that fails to start under the cap.
func spendCapTimeout(Timers) time.Duration { return 6 * time.Minute }

// capFixture is the project's monthly cap set a little above its spend and a busy session
// run until the cap stopped it (the states it was seen in), the create refused after, and a
// desktop created while the cap stopped admissions, with an MCP tool call to it.
type capFixture struct {
	prev    int64
	end     *client.Session
	seen    []client.SessionState
	refused error
	// The desktop: as it ended its start (failed, its message saying why), the call to it,
	// and its state after the call.
	desk      *client.Desktop
	deskSaw   string
	deskErr   error
	deskCall  mcpOutcome
	deskAfter desktop.State
}

// spendCapped makes the spend-cap fixture, putting the cap back when it is done (even when
// it failed or ran out of time). Its rows are Serial: the cap stops every session of the
// project.
func spendCapped(ctx context.Context, e *Env) (*capFixture, error) {
	return shared(ctx, e, "spendcap", func(ctx context.Context, e *Env) (*capFixture, error) {
		lim, err := e.C.GetLimits(ctx)
		if err != nil {
			return nil, err
		}
		f := &capFixture{prev: lim.MonthlySpendCapMicroUSD}
		defer func() {
			rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = e.C.PutLimits(rctx, client.PutLimitsRequest{MonthlySpendCapMicroUSD: &f.prev})
		}()
		// The session runs before the cap is set: the spend of the rows before (settling
		// still) may cross the cap at once, and a crossing stops the sessions running then.
		s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
		if err != nil {
			return nil, err
		}
		f.seen = []client.SessionState{s.State}
		if _, err := e.Sh(ctx, s.ID, "(while :; do :; done) >/dev/null 2>&1 &"); err != nil {
			return nil, err
		}
		if lim, err = e.C.GetLimits(ctx); err != nil {
			return nil, err
		}
		capMicro := lim.SpendThisMonthMicroUSD + spendCapCushion
		if _, err := e.C.PutLimits(ctx, client.PutLimitsRequest{MonthlySpendCapMicroUSD: &capMicro}); err != nil {
			return nil, fmt.Errorf("set monthly_spend_cap_micro_usd: %w", err)
		}
		f.end, err = e.WaitSession(ctx, s.ID, "stopped by the cap", func(s *client.Session) (bool, error) {
			if f.seen[len(f.seen)-1] != s.State {
				f.seen = append(f.seen, s.State)
			}
			return s.State.Terminal(), nil
		})
		if err != nil {
			return nil, err
		}
		n, err := e.C.CreateSession(ctx, client.CreateSessionRequest{Tier: 2, EndUserID: e.Tag()})
		f.refused = err
		if err == nil {
			e.tracker().add(&e.tracker().sessions, n.ID)
			f.refused = errors.New("accepted")
		}
		f.capDesktop(ctx, e)
		return f, nil
	})
}

// capDesktop creates a desktop while the cap stops admissions: its session cannot be made,
// so it cannot start (seed 001: failed, message says why); then it makes a tool call to it.
func (f *capFixture) capDesktop(ctx context.Context, e *Env) {
	d, err := e.CreateDesktop(ctx, "conformance capped "+e.Tag())
	if err != nil {
		f.deskErr = err
		return
	}
	f.deskSaw = "create answered " + string(d.State)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	got, seen, err := e.waitDesktop(wctx, d.ID, desktop.Failed, desktop.Running)
	if err != nil {
		f.deskErr = err
		return
	}
	f.desk = got
	f.deskSaw += fmt.Sprintf("; %s, message %q", joinDesktopStates(seen), got.Message)
	if got.State != desktop.Failed {
		f.deskErr = errors.New("the desktop started although the cap stops admissions: no failed desktop to call")
		return
	}
	cs, err := e.mcpSession(ctx, got)
	if err != nil {
		f.deskErr = err
		return
	}
	defer cs.Close()
	f.deskCall = e.runCommand(ctx, cs, d.ID, mcpCommand)
	if after, err := e.C.GetDesktop(ctx, d.ID); err != nil {
		f.deskErr = err
	} else {
		f.deskAfter = after.State
	}
}

// spendCapRow checks the cap: the busy session stopped with state_reason spend_cap, and a
// create refused 402 after.
func spendCapRow(ctx context.Context, e *Env) (string, error) {
	f, err := spendCapped(ctx, e)
	if err != nil {
		return "", err
	}
	end := f.end
	saw := fmt.Sprintf("cap = spend + %d µUSD: session %s (%s) after %s; the next create → %s; cap put back to %d",
		spendCapCushion, end.State, deref(end.StateReason), end.StoppedAt.Sub(end.StartedAt.Time).Round(time.Second), statusOf(f.refused), f.prev)
	switch {
	case end.State != "stopped" || deref(end.StateReason) != "spend_cap":
		return saw, errors.New("want stopped with state_reason spend_cap")
	case apiStatus(f.refused) != 402 || apiErr(f.refused).Code != "spend_cap_reached":
		return saw, errors.New("want a create refused 402 spend_cap_reached")
	}
	return saw, nil
}
