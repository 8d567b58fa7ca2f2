package quota

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// A crossed hard cap stops admissions unless the spend decision lets them go on; then the
// enforcer lifts the stop through Accounts.
func TestEnforcerAdmissionStop(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	month := monthOf(t0)
	for i, c := range []struct {
		name      string
		endUser   string
		decide    func(context.Context, CapEvent) (SpendDecision, error)
		wantScope string // the scope whose cap stops admissions afterwards
	}{
		{name: "default", wantScope: "project"},
		{name: "default for an end user", endUser: "eu_1", wantScope: "end_user"},
		{name: "decision keeps admissions", decide: keepAdmissions},
		{name: "decision keeps an end user's admissions", endUser: "eu_1", decide: keepAdmissions},
	} {
		t.Run(c.name, func(t *testing.T) {
			project := fmt.Sprintf("proj_%d", i)
			if _, err := st.EnsureProject(ctx, project, project); err != nil {
				t.Fatal(err)
			}
			// What Caps does when the cap is crossed: set the flag, then call the enforcer.
			caps := NewCaps(rdb, nil, nil)
			ev := CapEvent{Project: project, EndUser: c.endUser, Scope: "project", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: month}
			if c.endUser != "" {
				ev.Scope = "end_user"
			}
			caps.check(ctx, ev)
			ev.Level = "hard"
			e := &Enforcer{Store: st, Accounts: accounts, Decide: c.decide}
			e.OnCap(ctx, ev)
			scope, _, err := accounts.CapState(ctx, project, c.endUser, t0)
			if err != nil {
				t.Fatal(err)
			}
			if scope != c.wantScope {
				t.Fatalf("admissions stopped by the %q cap, want %q", scope, c.wantScope)
			}
		})
	}
}

func keepAdmissions(context.Context, CapEvent) (SpendDecision, error) {
	return SpendDecision{Warnings: []string{"let them through"}}, nil
}

// An end user's crossed cap stops that user's sessions; a decision that widens the stop to
// the project stops every user's.
func TestEnforcerStopScope(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	for i, c := range []struct {
		name        string
		decide      func(context.Context, CapEvent) (SpendDecision, error)
		wantStopped map[string]bool // end user → their session stopped
	}{
		{name: "default", wantStopped: map[string]bool{"eu_1": true, "eu_2": false}},
		{name: "widened to the project", wantStopped: map[string]bool{"eu_1": true, "eu_2": true},
			decide: func(context.Context, CapEvent) (SpendDecision, error) {
				return SpendDecision{Stop: true, StopProject: true, DenyAdmission: true}, nil
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			project := fmt.Sprintf("proj_scope%d", i)
			ids := map[string]string{}
			for _, eu := range []string{"eu_1", "eu_2"} {
				now := time.Now()
				s, err := st.Create(ctx, &session.Session{ID: session.NewID("sess_", now), Tier: 2, State: session.Pending,
					ProjectID: project, EndUserID: &eu, Template: "tpl_base", Region: "local", CreatedAt: *session.At(now),
					IdleTimeoutS: 300, MaxLifetimeS: 3600}, 10)
				if err != nil {
					t.Fatal(err)
				}
				for _, ch := range []store.Change{
					{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
					{From: session.Provisioning, To: session.Running, Driver: session.Node},
				} {
					ch.Project, ch.ID = project, s.ID
					if _, err := st.Transition(ctx, ch); err != nil {
						t.Fatal(err)
					}
				}
				ids[eu] = s.ID
			}
			e := &Enforcer{Store: st, Decide: c.decide}
			e.OnCap(ctx, CapEvent{Project: project, EndUser: "eu_1", Scope: "end_user", Level: "hard",
				SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: monthOf(time.Now())})
			for eu, want := range c.wantStopped {
				s, err := st.Get(ctx, project, ids[eu])
				if err != nil {
					t.Fatal(err)
				}
				if got := s.State == session.Stopping; got != want {
					t.Errorf("%s's session is %s; stopped %v, want %v", eu, s.State, got, want)
				}
			}
		})
	}
}

// A hard cap also stops the sessions admitted before it was crossed that have yet to run: a
// pending one ends at once (its slot freed), a starting one is torn down, so neither runs
// past the cap.
func TestEnforcerStopsSessionsNotYetRunning(t *testing.T) {
	ctx := context.Background()
	st := store.New(redistest.Server(t))
	project := "proj_early"
	mk := func(changes ...store.Change) string { return newSession(t, st, project, nil, changes...) }
	pending := mk()
	starting := mk(store.Change{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"})
	stopper := &recordingStopper{}
	e := &Enforcer{Store: st, Stopper: stopper}
	e.OnCap(ctx, CapEvent{Project: project, Scope: "project", Level: "hard", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: monthOf(time.Now())})
	for id, want := range map[string]session.State{pending: session.Stopped, starting: session.Stopping} {
		s, err := st.Get(ctx, project, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.State != want || s.StateReason == nil || *s.StateReason != session.SpendCap {
			t.Errorf("session %s: %s (%v), want %s (spend_cap)", id, s.State, s.StateReason, want)
		}
	}
	if got := stopper.ids(); len(got) != 1 || got[0] != starting {
		t.Errorf("torn down %v, want only the starting session %s", got, starting)
	}
	if n, err := st.ActiveCount(ctx, project); err != nil || n != 1 {
		t.Errorf("active sessions %d (%v), want 1: the starting one until its node ends it", n, err)
	}
}

type recordingStopper struct {
	mu      sync.Mutex
	stopped []string
}

func (r *recordingStopper) Stop(_ context.Context, s *session.Session) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = append(r.stopped, s.ID)
	return nil
}

func (r *recordingStopper) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.stopped)
}

// A hard cap crossed while a session takes a snapshot stops it once the snapshot is taken:
// snapshotting has no transition of metering's, and the session would otherwise run on past
// the cap when the caller's snapshot returned it to running.
func TestEnforcerStopsSessionAfterItsSnapshot(t *testing.T) {
	ctx := context.Background()
	st := store.New(redistest.Server(t))
	project := "proj_snapcap"
	s := &session.Session{ID: newSession(t, st, project, nil,
		store.Change{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		store.Change{From: session.Provisioning, To: session.Running, Driver: session.Node},
		store.Change{From: session.Running, To: session.Snapshotting, Driver: session.Caller})}
	stopper := &recordingStopper{}
	e := &Enforcer{Store: st, Stopper: stopper}
	e.OnCap(ctx, CapEvent{Project: project, Scope: "project", Level: "hard", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: monthOf(time.Now())})

	// The snapshot is still being taken: nothing moves under it.
	time.Sleep(300 * time.Millisecond)
	if got, err := st.Get(ctx, project, s.ID); err != nil || got.State != session.Snapshotting {
		t.Fatalf("during the snapshot: %v %v, want snapshotting", got.State, err)
	}
	if _, err := st.Transition(ctx, store.Change{Project: project, ID: s.ID, From: session.Snapshotting, To: session.Running, Driver: session.Caller}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := st.Get(ctx, project, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == session.Stopping {
			if got.StateReason == nil || *got.StateReason != session.SpendCap {
				t.Errorf("stopping for %v, want spend_cap", got.StateReason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s 20 s after its snapshot ended; want stopping (spend_cap)", got.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for deadline := time.Now().Add(5 * time.Second); len(stopper.ids()) == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := stopper.ids(); len(got) != 1 || got[0] != s.ID {
		t.Errorf("torn down %v, want %s", got, s.ID)
	}
}

// resumingStopper resumes the paused session, as a caller's POST :resume would, while the
// enforcer tears down the first session it stops (a node call that takes seconds).
type resumingStopper struct {
	st              *store.Store
	project, paused string
	once            sync.Once
	err             error
}

func (r *resumingStopper) Stop(ctx context.Context, _ *session.Session) error {
	r.once.Do(func() {
		_, r.err = r.st.Transition(ctx, store.Change{Project: r.project, ID: r.paused, From: session.Paused, To: session.Running, Driver: session.Caller})
	})
	return nil
}

// A session resumed while the hard cap's sweep stops the others is stopped too: listed one
// state at a time, it was running when the sweep had passed the running ones, and paused no
// more when it came to the paused ones, and it ran on past the cap.
func TestEnforcerStopsSessionResumedDuringItsSweep(t *testing.T) {
	ctx := context.Background()
	st := store.New(redistest.Server(t))
	project := "proj_resumed"
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	running := newSession(t, st, project, nil, up...)
	paused := newSession(t, st, project, nil, append(up, store.Change{From: session.Running, To: session.Paused, Driver: session.Caller})...)
	stopper := &resumingStopper{st: st, project: project, paused: paused}
	e := &Enforcer{Store: st, Stopper: stopper}
	e.OnCap(ctx, CapEvent{Project: project, Scope: "project", Level: "hard", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: monthOf(time.Now())})
	if stopper.err != nil {
		t.Fatalf("resume during the sweep: %v", stopper.err)
	}
	for _, id := range []string{running, paused} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			s, err := st.Get(ctx, project, id)
			if err != nil {
				t.Fatal(err)
			}
			if s.State == session.Stopping {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %s is %s 30 s after the hard cap's stop, want stopping (spend_cap)", id, s.State)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// failOnce fails the first script its client sends after it is armed, as a Redis that went
// away for a moment would.
type failOnce struct{ armed atomic.Bool }

func (h *failOnce) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && h.armed.CompareAndSwap(true, false) {
			cmd.SetErr(errors.New("connection reset by peer"))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

func (h *failOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A session whose stop failed (Redis away a moment) is stopped by a later pass: the cap's
// flag is set once a month, and nothing would try again.
func TestEnforcerRetriesAFailedStop(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	hook := &failOnce{}
	rdb.AddHook(hook)
	st := store.New(rdb)
	project := "proj_failstop"
	id := newSession(t, st, project, nil, store.Change{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		store.Change{From: session.Provisioning, To: session.Running, Driver: session.Node})
	hook.armed.Store(true)
	e := &Enforcer{Store: st, Stopper: &recordingStopper{}}
	e.OnCap(ctx, CapEvent{Project: project, Scope: "project", Level: "hard", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: monthOf(time.Now())})
	if hook.armed.Load() {
		t.Fatal("the hook failed no script: the test no longer fails the stop")
	}
	s, err := st.Get(ctx, project, id)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != session.Stopping {
		t.Fatalf("session is %s after the hard cap's stop failed once, want stopping (spend_cap)", s.State)
	}
}

// newSession creates a pending session of project (of end user eu, when not nil), takes it
// through changes, and answers its id.
func newSession(t *testing.T, st *store.Store, project string, eu *string, changes ...store.Change) string {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	s, err := st.Create(ctx, &session.Session{ID: session.NewID("sess_", now), Tier: 2, State: session.Pending,
		ProjectID: project, EndUserID: eu, Template: "tpl_base", Region: "local", CreatedAt: *session.At(now),
		IdleTimeoutS: 300, MaxLifetimeS: 3600}, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range changes {
		ch.Project, ch.ID = project, s.ID
		if _, err := st.Transition(ctx, ch); err != nil {
			t.Fatal(err)
		}
	}
	return s.ID
}

// failScripts fails every script its client sends while on, as a Redis (or a node) away for
// longer than the hard cap's passes would.
type failScripts struct{ on atomic.Bool }

func (h *failScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && h.on.Load() {
			cmd.SetErr(errors.New("connection reset by peer"))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

func (h *failScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A hard cap whose stops fail through every pass is enforced by a later round of the settler:
// the cap's flag is set once a month, and nothing else would try again while the session ran
// on past the cap. The round carries on the stop as decided; a raised cap drops it.
func TestSettlerRoundStopsWhatTheCapsPassesLeftLive(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	hook := &failScripts{}
	rdb.AddHook(hook)
	st := store.New(rdb)
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	month := monthOf(time.Now())
	state := func(project, id string) session.State {
		t.Helper()
		s, err := st.Get(ctx, project, id)
		if err != nil {
			t.Fatal(err)
		}
		return s.State
	}
	const stopped, raised, kept = "proj_later", "proj_raised", "proj_kept"
	ids := map[string]string{}
	for _, p := range []string{stopped, raised, kept} {
		ids[p] = newSession(t, st, p, nil, up...)
	}
	e := &Enforcer{Store: st, Accounts: NewAccounts(rdb), Stopper: &recordingStopper{}}
	hook.on.Store(true)
	for _, p := range []string{stopped, raised} {
		e.OnCap(ctx, CapEvent{Project: p, Scope: "project", Level: "hard", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: month})
	}
	// The decision said warn only: no round stops its sessions.
	e.Decide = func(context.Context, CapEvent) (SpendDecision, error) { return SpendDecision{DenyAdmission: true}, nil }
	e.OnCap(ctx, CapEvent{Project: kept, Scope: "project", Level: "hard", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: month})
	hook.on.Store(false)
	if got := state(stopped, ids[stopped]); got != session.Running {
		t.Fatalf("the session is %s while every stop failed: the test no longer fails them", got)
	}
	if err := e.Accounts.Uncap(ctx, raised, 1_000_000, time.Now()); err != nil { // PUT /v1/limits raised the cap
		t.Fatal(err)
	}
	// Admitted after the crossing (as when the decision lets admissions go on): not the
	// decision's to stop.
	later := newSession(t, st, stopped, nil, up...)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = NewSettler(rdb, SettlerOptions{Consumer: "later", Enforcer: e}).Run(runCtx)
	}()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(30 * time.Second); state(stopped, ids[stopped]) != session.Stopping; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the session is %s 30 s after its stops came back, want stopping (spend_cap): no later round stopped it", state(stopped, ids[stopped]))
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ps, err := st.CapStopProjects(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("projects still holding stops after they were done: %v", ps)
		}
	}
	for _, p := range []string{raised, kept} {
		if got := state(p, ids[p]); got != session.Running {
			t.Errorf("%s's session is %s, want running (its cap was raised, or its decision did not stop)", p, got)
		}
	}
	if got := state(stopped, later); got != session.Running {
		t.Errorf("the session created after the crossing is %s, want running", got)
	}
}

// accrueDuring settles usage right after the first command, once armed, that names the spend
// hash: a record settled while the end-user uncap reads the spend and lifts the flags.
type accrueDuring struct {
	spendKey string
	armed    atomic.Bool
	accrue   func(context.Context)
}

func (h *accrueDuring) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *accrueDuring) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if slices.Contains(cmd.Args(), any(h.spendKey)) && h.armed.CompareAndSwap(true, false) {
			h.accrue(ctx)
		}
		return err
	}
}

func (h *accrueDuring) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A raised end-user cap lifts an end user's flag only if its spend is under the cap when the
// flag is deleted: a record settled between the read of the spend and the deletion, taking
// the end user past the new cap, found the flag still set (so Caps did not flag it again),
// and the deletion then admitted an end user over its cap for the rest of the month.
func TestEndUserUncapRacesNoAccrual(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	accounts := NewAccounts(rdb)
	const project = "proj_uncap"
	rs := records(project, []string{"sess_u"}, 8) // 28 µUSD each
	for i := range rs {
		rs[i].EndUserID = "eu_u"
	}
	settle := func(ctx context.Context) {
		t.Helper()
		s := NewSettler(rdb, SettlerOptions{Caps: NewCaps(rdb, nil, nil)})
		for n, err := s.SettleProject(ctx, project); n > 0 || err != nil; n, err = s.SettleProject(ctx, project) {
			if err != nil {
				t.Error(err)
				return
			}
		}
	}
	if err := accounts.SetLimits(ctx, project, Limits{EndUserMonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	appendAll(t, rdb, rs[:4]) // 112 µUSD: past the cap of 100
	settle(ctx)
	if scope, _, err := accounts.CapState(ctx, project, "eu_u", t0); err != nil || scope != "end_user" {
		t.Fatalf("eu_u not stopped at 112 µUSD under a cap of 100: %q, %v", scope, err)
	}
	// The cap is raised to 200 while eu_u's next records (224 µUSD in all) are settled.
	hook := &accrueDuring{spendKey: store.ProjectKeys(project).Spend(), accrue: func(ctx context.Context) {
		appendAll(t, rdb, rs[4:])
		settle(ctx)
	}}
	rdb.AddHook(hook)
	hook.armed.Store(true)
	if err := accounts.SetLimits(ctx, project, Limits{EndUserMonthlySpendCapMicroUSD: 200}); err != nil {
		t.Fatal(err)
	}
	if err := accounts.UncapEndUsers(ctx, project, 200, t0); err != nil {
		t.Fatal(err)
	}
	if hook.armed.Load() {
		t.Fatal("the uncap never read the spend: the test no longer settles during it")
	}
	spend, err := accounts.Spend(ctx, project, "eu_u", t0)
	if err != nil || spend != 224 {
		t.Fatalf("eu_u's spend %d (%v), want 224", spend, err)
	}
	if scope, _, err := accounts.CapState(ctx, project, "eu_u", t0); err != nil || scope != "end_user" {
		t.Fatalf("eu_u admitted (stopped by %q, %v) with a spend of 224 µUSD over the raised cap of 200", scope, err)
	}
}

// recordsNow is records of session in project, n seconds of running ending now (this month,
// so that the crossed cap's stops still apply).
func recordsNow(project, sess string, n int) []Record {
	rs := records(project, []string{sess}, n)
	shift := time.Now().Add(-time.Duration(n) * time.Second).Sub(t0)
	for i := range rs {
		rs[i].FromMs += shift.Milliseconds()
		rs[i].ToMs += shift.Milliseconds()
		rs[i].EndUserID = ""
	}
	return rs
}

// quotaEvents counts the quota.exceeded events in project's outbox.
func quotaEvents(t *testing.T, st *store.Store, project string) int {
	t.Helper()
	evs, err := st.OutboxEvents(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Type == session.EventQuotaExceeded {
			n++
		}
	}
	return n
}

// A settler that dies between flagging a hard cap and acting on it (its decision, event and
// stops come after the settle) leaves the cap's undecided stop with the flag, and a later
// round decides it: the flag is set once a month, and nothing stopped the sessions then. A
// settler that lives decides it itself and leaves nothing for a later round.
func TestCapCrossedByADeadSettlerIsDecided(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	state := func(project, id string) session.State {
		t.Helper()
		s, err := st.Get(ctx, project, id)
		if err != nil {
			t.Fatal(err)
		}
		return s.State
	}
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}}
	const dead, alive = "proj_dead", "proj_alive"
	ids := map[string]string{}
	for _, p := range []string{dead, alive} {
		if err := accounts.SetLimits(ctx, p, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
			t.Fatal(err)
		}
		ids[p] = newSession(t, st, p, nil, up...)
		appendAll(t, rdb, recordsNow(p, "sess_x", 10)) // 280 µUSD: past the cap
	}
	// The dead settler's acts never run.
	if _, err := NewSettler(rdb, SettlerOptions{Caps: NewCaps(rdb, func(context.Context, CapEvent) {}, nil)}).SettleProject(ctx, dead); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSettler(rdb, SettlerOptions{Caps: NewCaps(rdb, e.OnCap, nil)}).SettleProject(ctx, alive); err != nil {
		t.Fatal(err)
	}
	if scope, _, err := accounts.CapState(ctx, dead, "", time.Now()); err != nil || scope != "project" {
		t.Fatalf("the dead settler's cap: admissions stopped by %q (%v), want project", scope, err)
	}
	if got := state(alive, ids[alive]); got != session.Stopping {
		t.Fatalf("the live settler's session is %s, want stopping", got)
	}
	// A round soon after leaves the crossing to its settler, which may be acting on it still.
	if err := e.RetryStops(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := state(dead, ids[dead]); got != session.Running {
		t.Fatalf("the session is %s after a round right after the crossing, want running (its settler decides)", got)
	}
	// Minutes later, the dead settler's crossing is decided by the round.
	later := time.Now().Add(10 * time.Minute)
	for i := 0; i < 3; i++ {
		if err := e.RetryStops(ctx, later); err != nil {
			t.Fatal(err)
		}
	}
	if got := state(dead, ids[dead]); got != session.Stopping {
		t.Errorf("the session is %s minutes after its settler died past the hard cap, want stopping (spend_cap)", got)
	}
	for _, p := range []string{dead, alive} {
		if n := quotaEvents(t, st, p); n != 1 {
			t.Errorf("%s: %d quota.exceeded events, want 1", p, n)
		}
		if stops, err := st.CapStops(ctx, p); err != nil || len(stops) != 0 {
			t.Errorf("%s: held stops %v (%v) after its cap was decided and its session stopped, want none", p, stops, err)
		}
	}
	if ps, err := st.CapStopProjects(ctx); err != nil || len(ps) != 0 {
		t.Errorf("projects with held stops %v (%v), want none", ps, err)
	}
}

// A hard cap whose decision stops the sessions but lets admissions go on fires once a month,
// as any cap: lifting the admission stop deleted the cap's flag, so every record settled
// after crossed the cap again, sending quota.exceeded each time and stopping the sessions
// admitted since.
func TestCapLiftedByItsDecisionFiresOnce(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const project = "proj_lifted"
	if err := accounts.SetLimits(ctx, project, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	e := &Enforcer{Store: st, Accounts: accounts, Stopper: &recordingStopper{}, Decide: func(context.Context, CapEvent) (SpendDecision, error) {
		return SpendDecision{Stop: true}, nil
	}}
	s := NewSettler(rdb, SettlerOptions{Caps: NewCaps(rdb, e.OnCap, nil), Batch: 2})
	first := newSession(t, st, project, nil, up...)
	appendAll(t, rdb, recordsNow(project, "sess_a", 10)) // 280 µUSD: past the cap
	if _, err := s.SettleProject(ctx, project); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Get(ctx, project, first); err != nil || got.State != session.Stopping {
		t.Fatalf("the session live at the crossing: %v (%v), want stopping", got.State, err)
	}
	if scope, _, err := accounts.CapState(ctx, project, "", time.Now()); err != nil || scope != "" {
		t.Fatalf("admissions stopped by %q (%v), want none: the decision lets them go on", scope, err)
	}
	// Admitted after the crossing, while spend goes on past the cap.
	admitted := newSession(t, st, project, nil, up...)
	for i, sess := range []string{"sess_b", "sess_c", "sess_d"} {
		appendAll(t, rdb, recordsNow(project, sess, 4))
		if _, err := s.SettleProject(ctx, project); err != nil {
			t.Fatal(err)
		}
		if n := quotaEvents(t, st, project); n != 1 {
			t.Fatalf("%d quota.exceeded events after %d more settles past the cap, want 1", n, i+1)
		}
	}
	if got, err := st.Get(ctx, project, admitted); err != nil || got.State != session.Running {
		t.Errorf("the session admitted after the crossing is %s (%v), want running", got.State, err)
	}
}

// A raised project cap lifts the project's flag only if its spend is under the cap when the
// flag is deleted, as the end users' (TestEndUserUncapRacesNoAccrual): a record settled
// between the read of the spend and the deletion took the project past the raised cap while
// the flag, still set, kept Caps from flagging it again.
func TestProjectUncapRacesNoAccrual(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	accounts := NewAccounts(rdb)
	const project = "proj_puncap"
	rs := records(project, []string{"sess_p"}, 8) // 28 µUSD each
	settle := func(ctx context.Context) {
		t.Helper()
		s := NewSettler(rdb, SettlerOptions{Caps: NewCaps(rdb, nil, nil)})
		for n, err := s.SettleProject(ctx, project); n > 0 || err != nil; n, err = s.SettleProject(ctx, project) {
			if err != nil {
				t.Error(err)
				return
			}
		}
	}
	if err := accounts.SetLimits(ctx, project, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	appendAll(t, rdb, rs[:4]) // 112 µUSD: past the cap of 100
	settle(ctx)
	if scope, _, err := accounts.CapState(ctx, project, "", t0); err != nil || scope != "project" {
		t.Fatalf("not stopped at 112 µUSD under a cap of 100: %q, %v", scope, err)
	}
	// The cap is raised to 200 while the next records (224 µUSD in all) are settled.
	hook := &accrueDuring{spendKey: store.ProjectKeys(project).Spend(), accrue: func(ctx context.Context) {
		appendAll(t, rdb, rs[4:])
		settle(ctx)
	}}
	rdb.AddHook(hook)
	hook.armed.Store(true)
	if err := accounts.SetLimits(ctx, project, Limits{MonthlySpendCapMicroUSD: 200}); err != nil {
		t.Fatal(err)
	}
	if err := accounts.Uncap(ctx, project, 200, t0); err != nil {
		t.Fatal(err)
	}
	if hook.armed.Load() {
		t.Fatal("the uncap never read the spend: the test no longer settles during it")
	}
	spend, err := accounts.Spend(ctx, project, "", t0)
	if err != nil || spend != 224 {
		t.Fatalf("spend %d (%v), want 224", spend, err)
	}
	if scope, _, err := accounts.CapState(ctx, project, "", t0); err != nil || scope != "project" {
		t.Fatalf("admitted (stopped by %q, %v) with a spend of 224 µUSD over the raised cap of 200", scope, err)
	}
	// Raised above the spend, the cap lifts the flag, and its soft mark (under 80 %).
	if err := accounts.Uncap(ctx, project, 1000, t0); err != nil {
		t.Fatal(err)
	}
	if scope, soft, err := accounts.CapState(ctx, project, "", t0); err != nil || scope != "" || soft {
		t.Fatalf("under a cap of 1000 with 224 µUSD spent: stopped by %q, soft %v (%v); want neither", scope, soft, err)
	}
}

// snapshotWaits counts the goroutines waiting for a session's snapshot to end.
func snapshotWaits() int {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	return strings.Count(b.String(), "quota.(*Enforcer).stopAfterSnapshot(")
}

// A cap's stop waits once for a session's snapshot to end, however many passes find it
// snapshotting: each pass (and each later round) started another wait, a goroutine polling
// Redis every 100 ms for up to ten minutes.
func TestEnforcerWaitsOnceForASnapshot(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	hook := &failScripts{}
	rdb.AddHook(hook)
	st := store.New(rdb)
	const project = "proj_snapwait"
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	snap := newSession(t, st, project, nil, append(up, store.Change{From: session.Running, To: session.Snapshotting, Driver: session.Caller})...)
	newSession(t, st, project, nil, up...) // its stop fails: every pass runs
	before := snapshotWaits()
	e := &Enforcer{Store: st, Stopper: &recordingStopper{}}
	hook.on.Store(true)
	e.OnCap(ctx, CapEvent{Project: project, Scope: "project", Level: "hard", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: monthOf(time.Now())})
	hook.on.Store(false)
	// A wait's goroutine shows in stopAfterSnapshot once it has begun to run.
	for deadline := time.Now().Add(10 * time.Second); snapshotWaits()-before < 1 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // any other wait started would have begun by now too
	if n := snapshotWaits() - before; n != 1 {
		t.Errorf("%d waits for the snapshotting session after the cap's passes, want 1", n)
	}
	// The snapshot ends: the wait stops the session, and ends.
	if _, err := st.Transition(ctx, store.Change{Project: project, ID: snap, From: session.Snapshotting, To: session.Running, Driver: session.Caller}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); snapshotWaits() > before; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d waits left 10 s after the snapshot ended", snapshotWaits()-before)
		}
	}
	if s, err := st.Get(ctx, project, snap); err != nil || s.State != session.Stopping {
		t.Errorf("the session is %s (%v) after its snapshot, want stopping", s.State, err)
	}
}

// A cap's stop that leaves a session snapshotting is held until the session is stopped: the
// wait for its snapshot counted it as stopped, and no stop was held, so a process that died
// during the wait (up to ten minutes), or a wait that timed out, left it running past the
// cap for the month. The cap's passes do not run on for it meanwhile (the settler's loop
// waits on them).
func TestCapStopHeldWhileASnapshotIsAwaited(t *testing.T) {
	ctx := context.Background()
	st := store.New(redistest.Server(t))
	const project = "proj_snaphold"
	up := []store.Change{{From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "n1"},
		{From: session.Provisioning, To: session.Running, Driver: session.Node}}
	snap := newSession(t, st, project, nil, append(up, store.Change{From: session.Running, To: session.Snapshotting, Driver: session.Caller})...)
	month := monthOf(time.Now())
	before := snapshotWaits()
	start := time.Now()
	(&Enforcer{Store: st, Stopper: &recordingStopper{}}).OnCap(ctx, CapEvent{Project: project, Scope: "project", Level: "hard", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: month})
	if d := time.Since(start); d >= retryAfter {
		t.Errorf("the cap's stop took %v with a session snapshotting, want one pass (under %v)", d, retryAfter)
	}
	stops, err := st.CapStops(ctx, project)
	if err != nil || stops[capStopID("", month)] == "" {
		t.Fatalf("held stops %v (%v) while the session's snapshot is awaited, want the cap's", stops, err)
	}
	// Another process's round (this one's wait gone with it) waits for the snapshot too.
	other := &Enforcer{Store: st, Stopper: &recordingStopper{}}
	if err := other.RetryStops(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A wait's goroutine shows in stopAfterSnapshot once it has begun to run (a loaded cold
	// run counted 1 just after the round).
	for deadline := time.Now().Add(10 * time.Second); snapshotWaits()-before != 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d waits for the snapshot after another process's round, want 2", snapshotWaits()-before)
		}
	}
	if stops, err := st.CapStops(ctx, project); err != nil || len(stops) != 1 {
		t.Errorf("held stops %v (%v) after a round with the snapshot still taken, want the cap's", stops, err)
	}
	if _, err := st.Transition(ctx, store.Change{Project: project, ID: snap, From: session.Snapshotting, To: session.Running, Driver: session.Caller}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); snapshotWaits() > before; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d waits left 10 s after the snapshot ended", snapshotWaits()-before)
		}
	}
	if s, err := st.Get(ctx, project, snap); err != nil || s.State != session.Stopping {
		t.Fatalf("the session is %s (%v) after its snapshot, want stopping", s.State, err)
	}
	if err := other.RetryStops(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if stops, err := st.CapStops(ctx, project); err != nil || len(stops) != 0 {
		t.Errorf("held stops %v (%v) once the session is stopped, want none", stops, err)
	}
	if ps, err := st.CapStopProjects(ctx); err != nil || len(ps) != 0 {
		t.Errorf("projects with held stops %v (%v), want none", ps, err)
	}
}
