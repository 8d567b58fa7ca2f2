package placer

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/internal/testwait"
	"wb/session"
	"wb/store"
)

// runPlacer runs p until the test ends and waits until it reads pending signals (its start
// sweep is over: what it places after that came by a signal).
func runPlacer(t *testing.T, rdb redis.UniversalClient, p *Placer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, 30*time.Second, "the placer reads pending signals", func() bool {
		return hasGroup(rdb, "wb:signal:pending", signalGroup)
	})
}

func hasGroup(rdb redis.UniversalClient, stream, group string) bool {
	groups, _ := rdb.XInfoGroups(context.Background(), stream).Result()
	return slices.ContainsFunc(groups, func(g redis.XInfoGroup) bool { return g.Name == group })
}

// runSetup is setup for a running placer: a real clock, nodes that stay alive for the
// test (HeartbeatTimeout an hour, unless cfg says otherwise) and tiers (for both the store
// and the placer).
func runSetup(t *testing.T, tiers session.Tiers) (redis.UniversalClient, *store.Store, *recorder) {
	t.Helper()
	rdb := redistest.Server(t)
	st := store.New(rdb, store.WithTiers(tiers))
	ctx := context.Background()
	if _, err := st.EnsureProject(ctx, "proj_a", "a"); err != nil {
		t.Fatal(err)
	}
	if err := st.SetPlan(ctx, "proj_a", store.PlanChange{NodeSharePct: ptr(100)}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []store.NodeInfo{
		{ID: "n_small", Region: "r1", Zone: "r1-a", Tiers: []int{1, 2}, VCPU: 4, MemoryMiB: 4096},
		{ID: "n_other", Region: "r2", Zone: "r2-a", Tiers: []int{1, 2, 3, 4}, VCPU: 64, MemoryMiB: 1 << 20},
	} {
		if err := st.Heartbeat(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	return rdb, st, &recorder{placed: map[string]string{}}
}

func state(t *testing.T, st *store.Store, project, id string) *session.Session {
	t.Helper()
	s, err := st.Get(context.Background(), project, id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRunPlacesOnSignal: a session created while the placer waits is placed at once: its
// signal wakes the placer (no sweep runs after the first).
func TestRunPlacesOnSignal(t *testing.T) {
	rdb, st, rec := runSetup(t, session.DefaultTiers())
	runPlacer(t, rdb, New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: time.Hour, FullSweepEvery: time.Hour}))
	start := time.Now()
	s := pending(t, st, "proj_a", "r1", 1, 1024)
	testwait.For(t, 30*time.Second, "the session placed", func() bool { return rec.nodeOf(s.ID) == "n_small" })
	if d := time.Since(start); d >= maxWait {
		t.Fatalf("placed %v after its creation, want at once", d)
	}
	if got := state(t, st, "proj_a", s.ID); got.State != session.Provisioning {
		t.Fatalf("placed session is %s", got.State)
	}
}

// fastTiers have a provisioning deadline of 600 ms.
func fastTiers() session.Tiers {
	tiers := session.DefaultTiers()
	for i := range tiers {
		tiers[i].ColdP95 = 200 * time.Millisecond
	}
	return tiers
}

// TestRunProvisioningDeadline: a session that never leaves pending (no node offers its
// tier) and one whose node never reports fail with provision_timeout when their deadline
// comes, not before, with nothing else happening.
func TestRunProvisioningDeadline(t *testing.T) {
	tiers := fastTiers()
	rdb, st, rec := runSetup(t, tiers)
	runPlacer(t, rdb, New(Config{Store: st, Provisioner: rec, Tiers: tiers, HeartbeatTimeout: time.Hour, FullSweepEvery: time.Hour}))
	stuck := pending(t, st, "proj_a", "r1", 4, 1024)  // nobody in r1 offers tier 4
	silent := pending(t, st, "proj_a", "r1", 1, 1024) // placed; the recorder never reports
	deadline := 3 * tiers[0].ColdP95
	for _, s := range []*session.Session{stuck, silent} {
		testwait.For(t, 30*time.Second, s.ID+" failed", func() bool { return state(t, st, "proj_a", s.ID).State == session.Failed })
		got := state(t, st, "proj_a", s.ID)
		if got.StateReason == nil || *got.StateReason != session.ProvisionTimeout {
			t.Fatalf("%s failed with %v, want provision_timeout", s.ID, got.StateReason)
		}
		// Millisecond timestamps: allow one of rounding.
		if at := got.StoppedAt.Sub(got.CreatedAt.Time); at < deadline-time.Millisecond || at > deadline+5*time.Second {
			t.Errorf("%s failed %v after its creation; its deadline is %v", s.ID, at, deadline)
		}
	}
	if rec.nodeOf(silent.ID) != "n_small" {
		t.Fatal("the silent session was never placed")
	}
	if n, _ := st.ActiveCount(context.Background(), "proj_a"); n != 0 {
		t.Fatalf("%d slots held after both failed", n)
	}
}

// commandLog records every command a client sends (pipelines included).
type commandLog struct {
	mu   sync.Mutex
	cmds []string
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}

func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			l.add(c)
		}
		return next(ctx, cmds)
	}
}

func (l *commandLog) add(cmd redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cmds = append(l.cmds, cmd.String())
}

func (l *commandLog) reset() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.cmds
	l.cmds = nil
	return out
}

// TestRunHostFailure: when a node's heartbeat lapses, the sessions on it fail with
// host_failure, found from the node's index: the placer walks no project to find them.
// Sessions on a live node are left alone.
func TestRunHostFailure(t *testing.T) {
	rdb := redistest.Server(t)
	log := &commandLog{}
	rdb.AddHook(log)
	st := store.New(rdb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 50 {
		if _, err := st.EnsureProject(ctx, fmt.Sprintf("proj_idle%d", i), "idle"); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"proj_a", "proj_b"} {
		if _, err := st.EnsureProject(ctx, p, p); err != nil {
			t.Fatal(err)
		}
	}
	dying := store.NodeInfo{ID: "n_dying", Region: "r1", Zone: "r1-a", Tiers: []int{1}, VCPU: 64, MemoryMiB: 1 << 20}
	live := store.NodeInfo{ID: "n_live", Region: "r2", Zone: "r2-a", Tiers: []int{1}, VCPU: 64, MemoryMiB: 1 << 20}
	for _, n := range []store.NodeInfo{dying, live} {
		if err := st.Heartbeat(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// n_live heartbeats throughout; n_dying never again.
	go func() {
		for ctx.Err() == nil {
			_ = st.Heartbeat(ctx, live)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	rec := &recorder{placed: map[string]string{}}
	const timeout = 2 * time.Second
	runPlacer(t, rdb, New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: timeout, FullSweepEvery: time.Hour}))
	var onDying []*session.Session
	for _, p := range []string{"proj_a", "proj_b"} {
		onDying = append(onDying, pending(t, st, p, "r1", 1, 256), pending(t, st, p, "r1", 1, 256))
	}
	onLive := pending(t, st, "proj_b", "r2", 1, 256)
	for _, s := range append(slices.Clone(onDying), onLive) {
		testwait.For(t, 30*time.Second, s.ID+" placed", func() bool { return rec.nodeOf(s.ID) != "" })
		// Running, so that the provisioning deadline is not what fails it.
		if _, err := st.Transition(ctx, store.Change{Project: s.ProjectID, ID: s.ID, From: session.Provisioning,
			To: session.Running, Driver: session.Node}); err != nil {
			t.Fatal(err)
		}
	}
	log.reset()
	for _, s := range onDying {
		testwait.For(t, 30*time.Second, s.ID+" failed", func() bool { return state(t, st, s.ProjectID, s.ID).State == session.Failed })
		if got := state(t, st, s.ProjectID, s.ID); got.StateReason == nil || *got.StateReason != session.HostFailure {
			t.Fatalf("%s failed with %v, want host_failure", s.ID, got.StateReason)
		}
	}
	testwait.For(t, 30*time.Second, "the dead node forgotten", func() bool {
		nodes, _ := st.Nodes(ctx)
		return !slices.ContainsFunc(nodes, func(n store.NodeInfo) bool { return n.ID == dying.ID })
	})
	if got := state(t, st, "proj_b", onLive.ID); got.State != session.Running {
		t.Fatalf("the session on the live node is %s", got.State)
	}
	for _, c := range log.reset() {
		if strings.Contains(c, "proj_idle") || strings.Contains(c, store.ProjectsKey) {
			t.Fatalf("the placer walked projects to find the dead node's sessions: %s", c)
		}
	}
}

// TestRunStartSweep: a pending session whose signal was lost (read and acknowledged by a
// placer that died before placing) is placed by the next placer's start sweep.
func TestRunStartSweep(t *testing.T) {
	rdb, st, rec := runSetup(t, session.DefaultTiers())
	ctx := context.Background()
	s := pending(t, st, "proj_a", "r1", 1, 1024)
	sigs, err := st.Signals(ctx, store.WorkPending, signalGroup, "gone", 0, 100)
	if err != nil || len(sigs) != 1 {
		t.Fatalf("the create's signal: %v %v", sigs, err)
	}
	if err := st.AckSignals(ctx, store.WorkPending, signalGroup, sigs); err != nil {
		t.Fatal(err)
	}
	runPlacer(t, rdb, New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: time.Hour, FullSweepEvery: time.Hour}))
	testwait.For(t, 30*time.Second, "the session placed", func() bool { return rec.nodeOf(s.ID) == "n_small" })
}

// countingRecorder counts provisions per session.
type countingRecorder struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *countingRecorder) Provision(_ context.Context, _ store.NodeInfo, s *session.Session) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[s.ID]++
	return nil
}

func (r *countingRecorder) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[id]
}

// TestRunPlacersShareSignals: two placers running at once, sessions of several projects
// created concurrently: each is provisioned once.
func TestRunPlacersShareSignals(t *testing.T) {
	rdb, st, _ := runSetup(t, session.DefaultTiers())
	ctx := context.Background()
	rec := &countingRecorder{n: map[string]int{}}
	for _, c := range []string{"p1", "p2"} {
		runPlacer(t, rdb, New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: time.Hour, FullSweepEvery: time.Hour, Consumer: c}))
	}
	var mu sync.Mutex
	var ids []*session.Session
	var wg sync.WaitGroup
	for i := range 4 {
		project := fmt.Sprintf("proj_share%d", i)
		if _, err := st.EnsureProject(ctx, project, project); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for range 5 {
				now := time.Now()
				s, err := st.Create(ctx, &session.Session{ID: session.NewID("sess_", now), Tier: 1, State: session.Pending,
					ProjectID: project, Template: "tpl_base@sha256:x", Region: "r2", CreatedAt: *session.At(now),
					Resources: session.Resources{VCPU: 1, MemoryMiB: 256, DiskGiB: 1, SizeClass: "s"}}, 100)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, s := range ids {
		testwait.For(t, 30*time.Second, s.ID+" placed", func() bool { return rec.count(s.ID) > 0 })
	}
	testwait.For(t, 30*time.Second, "every signal acknowledged", func() bool {
		n, _ := rdb.XLen(ctx, "wb:signal:pending").Result()
		return n == 0
	})
	for _, s := range ids {
		if n := rec.count(s.ID); n != 1 {
			t.Errorf("%s provisioned %d times", s.ID, n)
		}
	}
}

// TestRunRetriesWaiting: a session that found no room is placed when room frees up,
// though nothing signals it (a session ending on a node signals no placer).
func TestRunRetriesWaiting(t *testing.T) {
	rdb, st, rec := runSetup(t, session.DefaultTiers())
	ctx := context.Background()
	// At 50 % of n_small (4096 MiB), proj_a holds one 2048 MiB session at a time.
	if err := st.SetPlan(ctx, "proj_a", store.PlanChange{NodeSharePct: ptr(50)}); err != nil {
		t.Fatal(err)
	}
	runPlacer(t, rdb, New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: time.Hour, FullSweepEvery: time.Hour}))
	first := pending(t, st, "proj_a", "r1", 1, 2048)
	testwait.For(t, 30*time.Second, "the first placed", func() bool { return rec.nodeOf(first.ID) != "" })
	second := pending(t, st, "proj_a", "r1", 1, 2048)
	// It waits: give the placer its signal's round.
	testwait.For(t, 30*time.Second, "the second's signal handled", func() bool {
		n, _ := rdb.XLen(ctx, "wb:signal:pending").Result()
		return n == 0
	})
	if rec.nodeOf(second.ID) != "" {
		t.Fatal("placed past the project's share")
	}
	if _, err := st.Transition(ctx, store.Change{Project: "proj_a", ID: first.ID, From: session.Provisioning, To: session.Failed,
		Driver: session.Node, Reason: session.StartFailure}); err != nil {
		t.Fatal(err)
	}
	// As the node does when a session ends there (its claim counts against the project's
	// share until then, and its window is two hours here).
	if err := st.ReleaseOnNode(ctx, "n_small", store.Claim{Session: first.ID}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "the second placed once room freed up", func() bool { return rec.nodeOf(second.ID) == "n_small" })
}

// stallLog records whether the placer logged a stall.
type stallLog struct{ noted atomic.Bool }

func (l *stallLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *stallLog) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "woke up late") {
		l.noted.Store(true)
	}
	return nil
}
func (l *stallLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *stallLog) WithGroup(string) slog.Handler      { return l }

// TestRunStallIsNotAHostFailure: when the placer's wait ends far later than it meant (its
// host stalled with the nodes on it: a clock jump stands in for the stall here), a node whose
// heartbeats stopped during the stall and resume after it keeps its sessions; a node that
// stays silent still fails its sessions, a heartbeat timeout after the stall.
func TestRunStallIsNotAHostFailure(t *testing.T) {
	rdb := redistest.Server(t)
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	st := store.New(rdb, store.WithClock(clock))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := st.EnsureProject(ctx, "proj_a", "a"); err != nil {
		t.Fatal(err)
	}
	stalled := store.NodeInfo{ID: "n_stalled", Region: "r1", Zone: "r1-a", Tiers: []int{1}, VCPU: 64, MemoryMiB: 1 << 20}
	dead := store.NodeInfo{ID: "n_dead", Region: "r2", Zone: "r2-a", Tiers: []int{1}, VCPU: 64, MemoryMiB: 1 << 20}
	var beating, deadBeating atomic.Bool
	beating.Store(true)
	deadBeating.Store(true)
	var beats sync.WaitGroup
	beats.Add(1)
	go func() {
		defer beats.Done()
		for ctx.Err() == nil {
			if beating.Load() {
				_ = st.Heartbeat(ctx, stalled)
			}
			if deadBeating.Load() {
				_ = st.Heartbeat(ctx, dead)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer beats.Wait()
	defer cancel()
	rec := &recorder{placed: map[string]string{}}
	const timeout = 2 * time.Second
	log := &stallLog{}
	runPlacer(t, rdb, New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: timeout, FullSweepEvery: time.Hour,
		Now: clock, Logger: slog.New(log)}))
	onStalled, onDead := pending(t, st, "proj_a", "r1", 1, 256), pending(t, st, "proj_a", "r2", 1, 256)
	for _, s := range []*session.Session{onStalled, onDead} {
		testwait.For(t, 30*time.Second, s.ID+" placed", func() bool { return rec.nodeOf(s.ID) != "" })
		if _, err := st.Transition(ctx, store.Change{Project: s.ProjectID, ID: s.ID, From: session.Provisioning,
			To: session.Running, Driver: session.Node}); err != nil {
			t.Fatal(err)
		}
	}

	// The stall: no heartbeat from either node, and the clock jumps 30 s while the placer waits.
	beating.Store(false)
	deadBeating.Store(false)
	time.Sleep(300 * time.Millisecond) // a heartbeat under way has landed
	offset.Store(int64(30 * time.Second))
	testwait.For(t, 30*time.Second, "the placer notes its stall", log.noted.Load)
	beating.Store(true) // n_stalled comes back; n_dead does not

	testwait.For(t, 30*time.Second, onDead.ID+" failed", func() bool { return state(t, st, onDead.ProjectID, onDead.ID).State == session.Failed })
	if got := state(t, st, onDead.ProjectID, onDead.ID); got.StateReason == nil || *got.StateReason != session.HostFailure {
		t.Fatalf("the silent node's session failed with %v, want host_failure", got.StateReason)
	}
	time.Sleep(2 * timeout) // n_stalled heartbeats meanwhile
	if got := state(t, st, onStalled.ProjectID, onStalled.ID); got.State != session.Running {
		t.Fatalf("the session on the node that was stalled with the placer is %s, want running", got.State)
	}
}

// TestRunRetriesAProjectWhoseLockIsHeld: a project whose placement lock another placer holds
// is retried (as one waiting for room is) until this placer gets the lock: a holder whose
// round died (its Redis primary killed mid-round) never makes the round it was asked for,
// and the project's pending sessions waited for the next full sweep.
func TestRunRetriesAProjectWhoseLockIsHeld(t *testing.T) {
	tiers := session.DefaultTiers()
	tiers[1].ColdP95 = time.Minute // no provisioning deadline while the test waits
	rdb, st, rec := runSetup(t, tiers)
	s := pending(t, st, "proj_a", "r1", 2, 1024)
	if lock, _, err := st.LockPlacement(context.Background(), "proj_a"); err != nil || lock == nil {
		t.Fatalf("take the lock as the dead placer: %v, %v", lock, err)
	}
	runPlacer(t, rdb, New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: time.Hour, FullSweepEvery: time.Hour}))
	testwait.For(t, store.PlacementLease+30*time.Second, "the session placed once the dead placer's lock ran out",
		func() bool { return rec.nodeOf(s.ID) == "n_small" })
}
