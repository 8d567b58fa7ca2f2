package quota

import (
	"context"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// A crossed cap is decided once when the settler that flagged it acts after undecidedWait (a
// long settle of a busy project): another settler's round took the undecided stop over and
// decided it meanwhile, and the first settler's act decided it again, sending a second
// quota.exceeded.
func TestCapDecidedOnceWhenItsSettlerActsLate(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_late"
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	var decisions int
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}, Decide: func(context.Context, CapEvent) (SpendDecision, error) {
		decisions++
		return SpendDecision{Stop: true, DenyAdmission: true}, nil
	}}
	caps := NewCaps(rdb, e.OnCap, nil)
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 200, CapMicroUSD: 100, Month: monthOf(time.Now())})
	// Another settler's round, past the wait, decides the crossing.
	if err := e.RetryStops(ctx, time.Now().Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	// The first settler's settle ends: it acts on the crossing it flagged.
	caps.act(ctx, p)
	if n := quotaEvents(t, st, p); n != 1 || decisions != 1 {
		t.Errorf("%d quota.exceeded events and %d decisions, want 1 each", n, decisions)
	}
}

// A cap raised after it was crossed and before the crossing was decided is flagged when the
// raised cap is crossed: the stale decision, letting admissions go on, set the lifted mark
// after the raise had deleted the flags, and the mark kept Caps from flagging the cap again
// that month.
func TestCapRaisedBeforeItsDecisionIsFlaggedAgain(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_raise"
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	var decided []int64
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}, Decide: func(_ context.Context, ev CapEvent) (SpendDecision, error) {
		decided = append(decided, ev.CapMicroUSD)
		return SpendDecision{Stop: true}, nil // admissions go on
	}}
	caps := NewCaps(rdb, e.OnCap, nil)
	month := monthOf(time.Now())
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 150, CapMicroUSD: 100, Month: month})
	// PUT /v1/limits raises the cap (no spend recorded here: under it) before the settler acts.
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 1000}); err != nil {
		t.Fatal(err)
	}
	if err := accounts.Uncap(ctx, p, 1000, time.Now()); err != nil {
		t.Fatal(err)
	}
	caps.act(ctx, p) // the old crossing's, raised past
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: month})
	caps.act(ctx, p)
	if len(decided) != 1 || decided[0] != 1000 {
		t.Errorf("decisions of the caps %v, want [1000]: the raised cap's crossing alone", decided)
	}
	// A decision that comes after the raise in any other way leaves no lifted mark either.
	if err := accounts.Uncap(ctx, p, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := accounts.liftStop(ctx, CapEvent{Project: p, Scope: "project", Level: "hard", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: month}); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Exists(ctx, capLifted(p, "", month)).Result(); err != nil || n != 0 {
		t.Errorf("lifted mark set (%d, %v) by a decision after the raise, want none", n, err)
	}
}

// A hard cap's undecided stop is kept where settlers older than it do not look: they read the
// held stops (CapStops) as stops to carry on, and stopped every session in scope before any
// decision, then dropped the stop, and the project from the index of held stops.
func TestUndecidedStopHiddenFromOlderSettlers(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_mixed"
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	id := newSession(t, st, p, nil, up...)
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}}
	// The settler that flags the cap dies before it acts.
	NewCaps(rdb, e.OnCap, nil).check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 200, CapMicroUSD: 100, Month: monthOf(time.Now())})
	if stops, err := st.CapStops(ctx, p); err != nil || len(stops) != 0 {
		t.Fatalf("held stops as an older settler reads them: %v (%v), want none", stops, err)
	}
	// An older settler's round finds no held stop and forgets the project.
	if err := st.ForgetCapStopProject(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := e.RetryStops(ctx, time.Now().Add(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if s, err := st.Get(ctx, p, id); err != nil || s.State != session.Stopping {
		t.Errorf("the session is %s (%v) after a round minutes past the crossing, want stopping", s.State, err)
	}
	if n := quotaEvents(t, st, p); n != 1 {
		t.Errorf("%d quota.exceeded events, want 1", n)
	}
	if err := e.RetryStops(ctx, time.Now().Add(20*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if stops, err := st.CapUndecided(ctx, p); err != nil || len(stops) != 0 {
		t.Errorf("undecided stops %v (%v) after the decision, want none", stops, err)
	}
	if ps, err := st.CapUndecidedProjects(ctx); err != nil || len(ps) != 0 {
		t.Errorf("projects with undecided stops %v (%v), want none", ps, err)
	}
}

// A cap raised by an older binary (a rolling deploy), which deletes the cap's flag but knows
// nothing of its undecided stop, is not decided as still crossed: the stale decision stopped
// the sessions, and one that let admissions go on set the lifted mark, which kept the raised
// cap from being flagged for the rest of the month.
func TestCapRaisedByAnOlderBinaryIsNotDecided(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_oldraise"
	var decided []int64
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}, Decide: func(_ context.Context, ev CapEvent) (SpendDecision, error) {
		decided = append(decided, ev.CapMicroUSD)
		return SpendDecision{Stop: true}, nil // admissions go on
	}}
	caps := NewCaps(rdb, e.OnCap, nil)
	month := monthOf(time.Now())
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 150, CapMicroUSD: 100, Month: month})
	// An older gateway's PUT /v1/limits raises the cap: it deletes the flag alone.
	if err := rdb.Del(ctx, capFlag(p, "", "hard", month)).Err(); err != nil {
		t.Fatal(err)
	}
	caps.act(ctx, p)
	if err := e.RetryStops(ctx, time.Now().Add(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: month})
	caps.act(ctx, p)
	if len(decided) != 1 || decided[0] != 1000 {
		t.Errorf("decisions of the caps %v, want [1000]: the raised cap's crossing alone", decided)
	}
	if stops, err := st.CapUndecided(ctx, p); err != nil || len(stops) != 0 {
		t.Errorf("undecided stops %v (%v), want none", stops, err)
	}
}
