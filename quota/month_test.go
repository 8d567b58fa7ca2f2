package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// nextMonth answers the start of the month after t's (UTC).
func nextMonth(t time.Time) time.Time {
	y, m, _ := t.UTC().Date()
	return time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
}

// A hard cap crossed in the last minutes of a month by a settler that died is decided in the
// next month: its quota.exceeded is sent and the sessions live at the crossing are stopped,
// as they would have been; those admitted in the new month are not the crossing's. The round
// that looked after the month's end found no stop due in the new month and dropped the
// crossing, its event lost.
func TestCapCrossedAtTheMonthsEndIsDecided(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_monthend"
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	before := newSession(t, st, p, nil, up...)
	time.Sleep(5 * time.Millisecond)
	// The settler flags the cap and dies before acting on it.
	month := monthOf(time.Now())
	NewCaps(rdb, func(context.Context, CapEvent) {}, nil).check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 200, CapMicroUSD: 100, Month: month})
	time.Sleep(5 * time.Millisecond)
	after := newSession(t, st, p, nil, up...) // admitted once the new month has begun
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}}
	// The next round runs in the first minute of the next month.
	later := nextMonth(time.Now()).Add(30 * time.Second)
	for i := 0; i < 3; i++ {
		if err := e.RetryStops(ctx, later); err != nil {
			t.Fatal(err)
		}
	}
	if n := quotaEvents(t, st, p); n != 1 {
		t.Errorf("%d quota.exceeded events for the crossing decided in the next month, want 1", n)
	}
	for id, want := range map[string]session.State{before: session.Stopping, after: session.Running} {
		if s, err := st.Get(ctx, p, id); err != nil || s.State != want {
			t.Errorf("session %s is %s (%v), want %s", id, s.State, err, want)
		}
	}
	if left, err := st.CapUndecided(ctx, p); err != nil || len(left) != 0 {
		t.Errorf("undecided stops %v (%v) once decided, want none", left, err)
	}
}

// A stop held for the sessions a cap's decision left live is carried on past the month's
// end: those sessions were live when the cap was crossed, and a crossing in the month's last
// seconds left them running for good when the month changed. The sessions admitted since are
// not its.
func TestCapStopHeldPastTheMonthsEnd(t *testing.T) {
	ctx := context.Background()
	st := store.New(redistest.Server(t))
	const p = "proj_heldmonth"
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	before := newSession(t, st, p, nil, up...)
	time.Sleep(5 * time.Millisecond)
	crossed := time.Now()
	month := monthOf(crossed)
	time.Sleep(5 * time.Millisecond)
	after := newSession(t, st, p, nil, up...)
	b, err := json.Marshal(heldStop{CapEvent: CapEvent{Project: p, Scope: "project", Level: "hard", SpendMicroUSD: 200, CapMicroUSD: 100, Month: month}, CrossedAt: crossed})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.HoldCapStop(ctx, p, capStopID("", month), string(b), capFlagTTL); err != nil {
		t.Fatal(err)
	}
	e := &Enforcer{Store: st, Stopper: &recordingStopper{}}
	if err := e.RetryStops(ctx, nextMonth(crossed).Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]session.State{before: session.Stopping, after: session.Running} {
		if s, err := st.Get(ctx, p, id); err != nil || s.State != want {
			t.Errorf("session %s is %s (%v) after a round in the next month, want %s", id, s.State, err, want)
		}
	}
	if stops, err := st.CapStops(ctx, p); err != nil || len(stops) != 0 {
		t.Errorf("held stops %v (%v) once its sessions are stopped, want none", stops, err)
	}
}

// A soft cap crossed by a settler that died before acting on it is decided by a later round,
// once: the spend decision point hears of it (a plugin or policy may act at the soft level)
// as it would have from the settler; the crossing, flagged once a month, was lost with the
// settler. The default decision at the soft level stops nothing.
func TestSoftCapCrossedByADeadSettlerIsDecided(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_softdead"
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	id := newSession(t, st, p, nil, up...)
	var decided []string
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}, Decide: func(_ context.Context, ev CapEvent) (SpendDecision, error) {
		decided = append(decided, ev.Level)
		return SpendDecision{}, nil // the default at the soft level: a warning
	}}
	// The settler flags the soft cap (85 of 100) and dies before acting on it.
	NewCaps(rdb, func(context.Context, CapEvent) {}, nil).check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 85, CapMicroUSD: 100, Month: monthOf(time.Now())})
	if _, soft, err := accounts.CapState(ctx, p, "", time.Now()); err != nil || !soft {
		t.Fatalf("soft cap passed %v (%v) after the settle, want true", soft, err)
	}
	if err := e.RetryStops(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if len(decided) != 0 {
		t.Fatalf("decided %v right after the crossing, want nothing (its settler decides)", decided)
	}
	later := time.Now().Add(10 * time.Minute)
	for i := 0; i < 3; i++ {
		if err := e.RetryStops(ctx, later); err != nil {
			t.Fatal(err)
		}
	}
	if len(decided) != 1 || decided[0] != "soft" {
		t.Errorf("decisions %v minutes after the soft cap's settler died, want [soft]", decided)
	}
	if s, err := st.Get(ctx, p, id); err != nil || s.State != session.Running {
		t.Errorf("session is %s (%v) after the soft cap's decision, want running", s.State, err)
	}
	if n := quotaEvents(t, st, p); n != 0 {
		t.Errorf("%d quota.exceeded events for a soft cap, want 0", n)
	}
	if left, err := st.CapUndecided(ctx, p); err != nil || len(left) != 0 {
		t.Errorf("undecided stops %v (%v) once decided, want none", left, err)
	}

	// A settler that lives decides its soft crossing itself, and nothing is left to a round.
	const q = "proj_softalive"
	if err := accounts.SetLimits(ctx, q, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	decided = nil
	caps := NewCaps(rdb, e.OnCap, nil)
	caps.check(ctx, CapEvent{Project: q, Scope: "project", SpendMicroUSD: 85, CapMicroUSD: 100, Month: monthOf(time.Now())})
	caps.act(ctx, q)
	if err := e.RetryStops(ctx, later); err != nil {
		t.Fatal(err)
	}
	if len(decided) != 1 {
		t.Errorf("decisions %v of a live settler's soft crossing, want one", decided)
	}

	// A cap raised above the spend before the decision lifts the soft crossing with its mark.
	const r = "proj_softraise"
	if err := accounts.SetLimits(ctx, r, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	decided = nil
	NewCaps(rdb, func(context.Context, CapEvent) {}, nil).check(ctx, CapEvent{Project: r, Scope: "project", SpendMicroUSD: 85, CapMicroUSD: 100, Month: monthOf(time.Now())})
	NewCaps(rdb, func(context.Context, CapEvent) {}, nil).check(ctx, CapEvent{Project: r, EndUser: "eu_1", Scope: "end_user", SpendMicroUSD: 85, CapMicroUSD: 100, Month: monthOf(time.Now())})
	if left, err := st.CapUndecided(ctx, r); err != nil || len(left) != 2 {
		t.Fatalf("undecided stops %v (%v) after the project's and an end user's soft caps were crossed, want 2", left, err)
	}
	if err := accounts.Uncap(ctx, r, 1000, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := accounts.UncapEndUsers(ctx, r, 1000, time.Now()); err != nil {
		t.Fatal(err)
	}
	if left, err := st.CapUndecided(ctx, r); err != nil || len(left) != 0 {
		t.Errorf("undecided stops %v (%v) after the cap was raised above the spend, want none", left, err)
	}
	if err := e.RetryStops(ctx, later); err != nil {
		t.Fatal(err)
	}
	if len(decided) != 0 {
		t.Errorf("decisions %v of a soft cap raised before its decision, want none", decided)
	}
}

// quotaEventIDs answers the ids of the quota.exceeded events in project's outbox, oldest
// first.
func quotaEventIDs(t *testing.T, st *store.Store, project string) []string {
	t.Helper()
	evs, err := st.OutboxEvents(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ev := range evs {
		if ev.Type == session.EventQuotaExceeded {
			ids = append(ids, ev.ID)
		}
	}
	return ids
}

// A crossing decided again because its decision's end was not recorded (quota.exceeded is
// sent at least once) sends its event with the same id, derived from the crossing, so that
// receivers deduplicate it by id (webhook-id); each send had an id of its own, and a
// receiver saw two crossings. A cap crossed again after a raise is another crossing, with
// another id.
func TestCapEventSentAgainKeepsItsID(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_evid"
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}}
	undecided := store.ProjectKeys(p).CapUndecided()
	// The settler's decision sends quota.exceeded, then fails to drop the undecided stop.
	redistest.BeforeOnce(rdb, func(c redis.Cmder) bool {
		a := c.Args()
		return (c.Name() == "evalsha" || c.Name() == "eval") && len(a) > 3 && fmt.Sprint(a[2]) == "1" && a[3] == undecided
	}, func() error { return errors.New("connection reset by peer") })
	caps := NewCaps(rdb, e.OnCap, nil)
	month := monthOf(time.Now())
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 200, CapMicroUSD: 100, Month: month})
	caps.act(ctx, p)
	if left, err := st.CapUndecided(ctx, p); err != nil || len(left) != 1 {
		t.Fatalf("undecided stops %v (%v) after a decision whose end failed, want the crossing's", left, err)
	}
	// A later round, past the decision's time, decides the crossing again.
	if err := e.RetryStops(ctx, time.Now().Add(undecidedWait+time.Minute)); err != nil {
		t.Fatal(err)
	}
	ids := quotaEventIDs(t, st, p)
	if len(ids) != 2 {
		t.Fatalf("quota.exceeded events %v, want 2 (the crossing decided twice)", ids)
	}
	if ids[0] != ids[1] || !session.ValidID("evt_", ids[0]) {
		t.Errorf("quota.exceeded sent again with id %s, first %s: want the same evt_ id", ids[1], ids[0])
	}
	// Raised, then crossed again: another crossing.
	if err := accounts.Uncap(ctx, p, 1000, time.Now()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 200, CapMicroUSD: 100, Month: month})
	caps.act(ctx, p)
	ids = quotaEventIDs(t, st, p)
	if len(ids) != 3 || ids[2] == ids[0] {
		t.Errorf("quota.exceeded events %v after the cap was crossed again, want a third with an id of its own", ids)
	}
}

// A crossing decided again (its decision's end not recorded) sends a quota.exceeded that is
// the first's byte for byte: its id and its created_at are the crossing's (when its undecided
// stop says it was crossed), so that a receiver that deduplicates by id keeps no other
// created_at than the one it would have had. Before, the id was the same and created_at was
// the time of each send.
func TestCapEventSentAgainIsTheSame(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_evsame"
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}}
	undecided := store.ProjectKeys(p).CapUndecided()
	redistest.BeforeOnce(rdb, func(c redis.Cmder) bool {
		a := c.Args()
		return (c.Name() == "evalsha" || c.Name() == "eval") && len(a) > 3 && fmt.Sprint(a[2]) == "1" && a[3] == undecided
	}, func() error { return errors.New("connection reset by peer") })
	caps := NewCaps(rdb, e.OnCap, nil)
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 200, CapMicroUSD: 100, Month: monthOf(time.Now())})
	time.Sleep(20 * time.Millisecond) // the decision comes after the crossing
	caps.act(ctx, p)
	left, err := st.CapUndecided(ctx, p)
	if err != nil || len(left) != 1 {
		t.Fatalf("undecided stops %v (%v) after a decision whose end failed, want the crossing's", left, err)
	}
	var crossing heldStop
	for _, v := range left {
		if err := json.Unmarshal([]byte(v), &crossing); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // the second decision after the first
	if err := e.RetryStops(ctx, time.Now().Add(undecidedWait+time.Minute)); err != nil {
		t.Fatal(err)
	}
	evs, err := st.OutboxEvents(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var sent [][]byte
	var at []int64
	for _, ev := range evs {
		if ev.Type != session.EventQuotaExceeded {
			continue
		}
		b, err := webhooks.BuildPayload(ev)
		if err != nil {
			t.Fatal(err)
		}
		sent, at = append(sent, b), append(at, ev.AtMs)
	}
	if len(sent) != 2 {
		t.Fatalf("%d quota.exceeded events, want 2 (the crossing decided twice)", len(sent))
	}
	if string(sent[0]) != string(sent[1]) {
		t.Errorf("quota.exceeded sent again differs from the first:\n%s\n%s", sent[0], sent[1])
	}
	if at[0] != crossing.CrossedAt.UnixMilli() {
		t.Errorf("quota.exceeded created at %d ms, want the crossing's time, %d", at[0], crossing.CrossedAt.UnixMilli())
	}
}

// A settler that flags a hard cap in a month's last seconds and acts on it in the next
// stops the sessions live at the crossing, not those admitted in the new month before it
// acted (under the new month's caps), and no later round stops them either.
func TestCapActedOnInTheNextMonthSparesItsSessions(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_actnext"
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	before := newSession(t, st, p, nil, up...)
	time.Sleep(5 * time.Millisecond)
	var acted []CapEvent
	caps := NewCaps(rdb, func(_ context.Context, ev CapEvent) { acted = append(acted, ev) }, nil)
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 200, CapMicroUSD: 100, Month: monthOf(time.Now())})
	caps.act(ctx, p)
	if len(acted) != 1 {
		t.Fatalf("%d crossings to act on, want 1", len(acted))
	}
	time.Sleep(5 * time.Millisecond)
	after := newSession(t, st, p, nil, up...) // admitted in the new month, before the act
	time.Sleep(5 * time.Millisecond)
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}}
	next := nextMonth(time.Now()).Add(time.Second)
	e.onCapAt(ctx, acted[0], next)
	if err := e.RetryStops(ctx, next.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]session.State{before: session.Stopping, after: session.Running} {
		if s, err := st.Get(ctx, p, id); err != nil || s.State != want {
			t.Errorf("session %s is %s (%v), want %s", id, s.State, err, want)
		}
	}
}

// A record of last month settled in this month (its settler late) that crosses last month's
// cap is decided over the sessions of last month only: the crossing's flagging time, now,
// bounded the stop, and the sessions admitted this month, under this month's caps, were
// stopped with them.
func TestLateSettledLastMonthSparesThisMonthsSessions(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const p = "proj_late_last_month"
	if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	thisMonth := newSession(t, st, p, nil, up...) // admitted this month
	time.Sleep(5 * time.Millisecond)
	lastMonthStart := time.Date(time.Now().UTC().Year(), time.Now().UTC().Month()-1, 1, 0, 0, 0, 0, time.UTC)
	lastMonth := monthOf(lastMonthStart)
	// A session admitted last month, still running: the crossing's stop is its.
	at := lastMonthStart.Add(24 * time.Hour)
	old, err := st.Create(ctx, &session.Session{ID: session.NewID("sess_", at), Tier: 2, State: session.Pending,
		ProjectID: p, Template: "tpl_base", Region: "local", CreatedAt: *session.At(at), IdleTimeoutS: 300, MaxLifetimeS: 3600}, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range up {
		ch.Project, ch.ID = p, old.ID
		if _, err := st.Transition(ctx, ch); err != nil {
			t.Fatal(err)
		}
	}
	var acted []CapEvent
	caps := NewCaps(rdb, func(_ context.Context, ev CapEvent) { acted = append(acted, ev) }, nil)
	// A record of last month settled now takes last month's spend past its cap.
	caps.check(ctx, CapEvent{Project: p, Scope: "project", SpendMicroUSD: 200, CapMicroUSD: 100, Month: lastMonth})
	caps.act(ctx, p)
	if len(acted) != 1 {
		t.Fatalf("%d crossings to act on, want 1", len(acted))
	}
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}}
	e.onCapAt(ctx, acted[0], time.Now())
	if s, err := st.Get(ctx, p, thisMonth); err != nil || s.State != session.Running {
		t.Errorf("a session admitted this month, under this month's caps, is %s (%v) after last month's cap was decided, want running", s.State, err)
	}
	if s, err := st.Get(ctx, p, old.ID); err != nil || s.State != session.Stopping {
		t.Errorf("a session admitted last month is %s (%v) after last month's cap was decided, want stopping", s.State, err)
	}
}
