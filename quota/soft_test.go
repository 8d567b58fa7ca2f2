package quota

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// denyAtSoft is a spend decision point whose plugin denies at the soft level (or fails and is
// not fail-open): decide.Spend's answer then, a stop and a refusal of admissions in scope.
func denyAtSoft(_ context.Context, ev CapEvent) (SpendDecision, error) {
	if ev.Level == "soft" {
		return SpendDecision{Stop: true, DenyAdmission: true, Warnings: []string{"plugin budget denied"}}, nil
	}
	return SpendDecision{Stop: true, DenyAdmission: true}, nil
}

// admitIn creates a pending session of project (of end user eu, when not empty) through the
// admission, checking this month's cap flags, and answers its error.
func admitIn(t *testing.T, st *store.Store, project, eu string) error {
	t.Helper()
	now := time.Now()
	sess := &session.Session{ID: session.NewID("sess_", now), Tier: 2, State: session.Pending, ProjectID: project,
		Template: "tpl_base", Region: "local", CreatedAt: *session.At(now), IdleTimeoutS: 300, MaxLifetimeS: 3600}
	if eu != "" {
		sess.EndUserID = &eu
	}
	_, err := st.Admit(context.Background(), sess, store.Admission{CapMonth: CapMonth(now), Concurrency: 100})
	return err
}

// A soft cap whose decision denies (a plugin's deny, or a failure of one not fail-open)
// refuses new admissions in its scope with 402, as a hard cap does, until the cap is raised
// past the spend's soft level: it stopped the running sessions and went on admitting new
// ones. The hard cap crossed after it is still decided (its quota.exceeded sent).
func TestSoftCapDenyRefusesAdmissions(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}, Decide: denyAtSoft}
	settle := func(s *Settler, project string) {
		t.Helper()
		for n, err := s.SettleProject(ctx, project); n > 0 || err != nil; n, err = s.SettleProject(ctx, project) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct{ name, project, endUser, scope string }{
		{"project", "proj_softdeny", "", "project"},
		{"end user", "proj_softdeny_eu", "eu_1", "end_user"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, eu := c.project, c.endUser
			limits := Limits{MonthlySpendCapMicroUSD: 100}
			if eu != "" {
				limits = Limits{EndUserMonthlySpendCapMicroUSD: 100}
			}
			if err := accounts.SetLimits(ctx, p, limits); err != nil {
				t.Fatal(err)
			}
			var euID *string
			if eu != "" {
				euID = &eu
			}
			live := newSession(t, st, p, euID, up...)
			s := NewSettler(rdb, SettlerOptions{Caps: NewCaps(rdb, e.OnCap, nil), Enforcer: e})
			rs := recordsNow(p, "sess_a", 3) // 84 µUSD: past the soft cap of 80, under the hard one
			for i := range rs {
				rs[i].EndUserID = eu
			}
			appendAll(t, rdb, rs)
			settle(s, p)
			if got, err := st.Get(ctx, p, live); err != nil || got.State != session.Stopping {
				t.Fatalf("the session live at the soft crossing is %v (%v), want stopping (the decision denied)", got.State, err)
			}
			var se *store.SpendCapError
			if err := admitIn(t, st, p, eu); !errors.As(err, &se) || se.Scope != c.scope {
				t.Fatalf("a create in scope after a soft cap's deny: %v, want a spend cap refusal (402) of the %s", err, c.scope)
			}
			if eu != "" {
				if err := admitIn(t, st, p, "eu_other"); err != nil {
					t.Fatalf("another end user's create after eu_1's soft cap's deny: %v, want admitted", err)
				}
			}
			// PUT /v1/limits leaving the caps as they are does not lift it.
			uncap := func(capMicroUSD int64) {
				t.Helper()
				l := Limits{MonthlySpendCapMicroUSD: capMicroUSD}
				if eu != "" {
					l = Limits{EndUserMonthlySpendCapMicroUSD: capMicroUSD}
				}
				if err := accounts.SetLimits(ctx, p, l); err != nil {
					t.Fatal(err)
				}
				if err := accounts.Uncap(ctx, p, l.MonthlySpendCapMicroUSD, time.Now()); err != nil {
					t.Fatal(err)
				}
				if err := accounts.UncapEndUsers(ctx, p, l.EndUserMonthlySpendCapMicroUSD, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			uncap(100)
			if err := admitIn(t, st, p, eu); !errors.As(err, &se) {
				t.Fatalf("a create in scope after the caps were written again unchanged: %v, want a spend cap refusal", err)
			}
			// The hard cap crossed meanwhile (records settling late) is decided as ever.
			rs = recordsNow(p, "sess_b", 2) // 140 µUSD
			for i := range rs {
				rs[i].EndUserID = eu
			}
			appendAll(t, rdb, rs)
			settle(s, p)
			if n := quotaEvents(t, st, p); n != 1 {
				t.Fatalf("%d quota.exceeded events after the hard cap was crossed past the soft cap's deny, want 1", n)
			}
			// Raised above the spend, the cap admits again.
			uncap(1000)
			if err := admitIn(t, st, p, eu); err != nil {
				t.Fatalf("a create in scope after the cap was raised above the spend: %v, want admitted", err)
			}
		})
	}
}

// A soft cap's decision that stops the sessions holds its stop (left unfinished) apart from
// the hard cap's of the same scope and month: both were held under one id, so the one decided
// last replaced the other. Here the soft crossing, before the hard one, is decided after it
// (a round deciding what a dead settler left), and its stop, over the sessions created by
// the soft crossing, replaced the hard cap's: a session created between the two crossings ran
// on past the hard cap.
func TestSoftAndHardHeldStopsKeptApart(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	hook := &failScripts{}
	rdb.AddHook(hook)
	st := store.New(rdb)
	const p = "proj_softhard"
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	month := monthOf(time.Now())
	before := newSession(t, st, p, nil, up...)
	softAt := time.Now()
	time.Sleep(20 * time.Millisecond) // created after the soft crossing, whatever the clock's grain
	between := newSession(t, st, p, nil, up...)
	e := &Enforcer{Store: st, Accounts: NewAccounts(rdb), Stopper: &recordingStopper{}, Decide: denyAtSoft}
	hook.on.Store(true) // every stop fails: both decisions hold theirs
	e.OnCap(ctx, CapEvent{Project: p, Scope: "project", Level: "hard", SpendMicroUSD: 200, CapMicroUSD: 100, Month: month})
	e.decide(ctx, CapEvent{Project: p, Scope: "project", Level: "soft", SpendMicroUSD: 85, CapMicroUSD: 100, Month: month, crossedAt: softAt},
		time.Now(), slog.Default())
	hook.on.Store(false)
	if stops, err := st.CapStops(ctx, p); err != nil || len(stops) != 2 {
		t.Errorf("held stops %v (%v) after a hard and a soft decision of one scope and month, want 2", stops, err)
	}
	// Another process's round carries the held stops on.
	if err := (&Enforcer{Store: st, Stopper: &recordingStopper{}}).RetryStops(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]string{"before the soft crossing": before, "between the crossings": between} {
		if s, err := st.Get(ctx, p, id); err != nil || s.State != session.Stopping {
			t.Errorf("the session created %s is %v (%v) after the round, want stopping (spend_cap)", name, s.State, err)
		}
	}

	// A raised cap drops the soft cap's held stop, as the hard cap's, the project's and an
	// end user's.
	const q = "proj_softraised"
	eu := "eu_1"
	newSession(t, st, q, nil, up...)
	newSession(t, st, q, &eu, up...)
	hook.on.Store(true)
	e.decide(ctx, CapEvent{Project: q, Scope: "project", Level: "soft", SpendMicroUSD: 85, CapMicroUSD: 100, Month: month}, time.Now(), slog.Default())
	e.decide(ctx, CapEvent{Project: q, EndUser: eu, Scope: "end_user", Level: "soft", SpendMicroUSD: 85, CapMicroUSD: 100, Month: month}, time.Now(), slog.Default())
	hook.on.Store(false)
	if stops, err := st.CapStops(ctx, q); err != nil || len(stops) != 2 {
		t.Fatalf("held stops %v (%v) after the project's and an end user's soft decisions, want 2", stops, err)
	}
	// The end user's cap is flagged (as Caps does), for the raise to find it.
	NewCaps(rdb, nil, nil).check(ctx, CapEvent{Project: q, EndUser: eu, Scope: "end_user", SpendMicroUSD: 85, CapMicroUSD: 100, Month: month})
	if err := e.Accounts.Uncap(ctx, q, 1000, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.Accounts.UncapEndUsers(ctx, q, 1000, time.Now()); err != nil {
		t.Fatal(err)
	}
	if stops, err := st.CapStops(ctx, q); err != nil || len(stops) != 0 {
		t.Errorf("held stops %v (%v) after the caps were raised above the spend, want none", stops, err)
	}
}

// A soft cap's decision that denied admissions stands after a raise that leaves the spend
// past the raised cap's soft level, whether or not the hard cap was crossed in between: the
// hard cap's flag, crossed, holds its spend and no longer says that a soft deny set it, and a
// raise deleted it with the soft flag left, so the soft cap was never decided again and
// admissions went on until the raised hard cap.
func TestSoftDenyKeptAfterTheHardCapCrossed(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}, Decide: denyAtSoft}
	s := NewSettler(rdb, SettlerOptions{Caps: NewCaps(rdb, e.OnCap, nil), Enforcer: e})
	settle := func(p string) {
		for n, err := s.SettleProject(ctx, p); n > 0 || err != nil; n, err = s.SettleProject(ctx, p) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	raise := func(p string, c int64) {
		if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: c}); err != nil {
			t.Fatal(err)
		}
		if err := accounts.Uncap(ctx, p, c, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	for _, hardCrossed := range []bool{false, true} {
		p := "proj_softdeny"
		if hardCrossed {
			p += "_hard"
		}
		raise(p, 100)
		newSession(t, st, p, nil, up...)
		appendAll(t, rdb, recordsNow(p, "sess_a", 3)) // 84: soft crossed, denied
		settle(p)
		newCap := int64(100) // spend 84 >= soft 80
		if hardCrossed {
			appendAll(t, rdb, recordsNow(p, "sess_b", 2)) // 140: hard crossed
			settle(p)
			newCap = 160 // spend 140 < hard 160, >= soft 128
		}
		raise(p, newCap)
		var se *store.SpendCapError
		if err := admitIn(t, st, p, ""); !errors.As(err, &se) {
			t.Errorf("hard crossed in between=%v: a create after a raise leaving the soft level crossed: %v, want 402 (the soft deny stands)", hardCrossed, err)
		}
	}
}

// TestSoftDenyKeptAfterTheHardCapCrossed for an end user's caps (uncapEndUsersScript).
func TestSoftDenyKeptAfterTheHardCapCrossedEndUser(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}, Decide: denyAtSoft}
	s := NewSettler(rdb, SettlerOptions{Caps: NewCaps(rdb, e.OnCap, nil), Enforcer: e})
	const p, eu = "proj_softdeny_hard_eu", "eu_1"
	settle := func() {
		for n, err := s.SettleProject(ctx, p); n > 0 || err != nil; n, err = s.SettleProject(ctx, p) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	raise := func(c int64) {
		if err := accounts.SetLimits(ctx, p, Limits{EndUserMonthlySpendCapMicroUSD: c}); err != nil {
			t.Fatal(err)
		}
		if err := accounts.UncapEndUsers(ctx, p, c, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	raise(100)
	euID := eu
	newSession(t, st, p, &euID, up...)
	for _, c := range []struct {
		sess string
		n    int
	}{{"sess_a", 3}, {"sess_b", 2}} { // 84 (soft, denied), then 140 (hard)
		rs := recordsNow(p, c.sess, c.n)
		for i := range rs {
			rs[i].EndUserID = eu
		}
		appendAll(t, rdb, rs)
		settle()
	}
	raise(160) // 140 < 160, >= 128
	var se *store.SpendCapError
	if err := admitIn(t, st, p, eu); !errors.As(err, &se) {
		t.Errorf("an end user's create after a raise leaving its soft level crossed (its soft cap denied admissions): %v, want 402", err)
	}
}
