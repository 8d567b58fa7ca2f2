package quota

import (
	"context"
	"testing"
	"time"

	"wb/internal/redistest"
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
