package placer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

type recorder struct {
	mu     sync.Mutex
	placed map[string]string // session → node
}

func (r *recorder) Provision(_ context.Context, n store.NodeInfo, s *session.Session) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.placed[s.ID] = n.ID
	return nil
}

func (r *recorder) nodeOf(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.placed[id]
}

func pending(t testing.TB, st *store.Store, project, region string, tier, mem int) *session.Session {
	t.Helper()
	now := time.Now()
	s := &session.Session{ID: session.NewID("sess_", now), Tier: tier, State: session.Pending, ProjectID: project,
		Template: "tpl_base@sha256:x", Region: region, CreatedAt: *session.At(now), IdleTimeoutS: 300, MaxLifetimeS: 3600,
		Resources: session.Resources{VCPU: 1, MemoryMiB: mem, DiskGiB: 1, SizeClass: "s"}}
	out, err := st.Create(context.Background(), s, 100)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func setup(t *testing.T) (*store.Store, *recorder, *Placer, *time.Time) {
	return setupOn(t, redistest.Server(t))
}

func setupOn(t testing.TB, rdb *redis.Client) (*store.Store, *recorder, *Placer, *time.Time) {
	st := store.New(rdb)
	rec := &recorder{placed: map[string]string{}}
	now := time.Now()
	p := New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: 5 * time.Second, Now: func() time.Time { return now }})
	ctx := context.Background()
	if _, err := st.EnsureProject(ctx, "proj_a", "a"); err != nil {
		t.Fatal(err)
	}
	// proj_a may fill a node: these tests are about capacity; TestNodeShare is about shares.
	if err := st.SetPlan(ctx, "proj_a", store.PlanChange{NodeSharePct: ptr(100)}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []store.NodeInfo{
		{ID: "n_small", Region: "r1", Zone: "r1-a", Tiers: []int{1, 2}, VCPU: 4, MemoryMiB: 4096},
		{ID: "n_big", Region: "r1", Zone: "r1-b", Tiers: []int{2, 3}, VCPU: 16, MemoryMiB: 65536, UsedMemoryMiB: 40000},
		{ID: "n_other", Region: "r2", Zone: "r2-a", Tiers: []int{1, 2, 3, 4}, VCPU: 64, MemoryMiB: 1 << 20},
	} {
		if err := st.Heartbeat(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	return st, rec, p, &now
}

func TestPlacement(t *testing.T) {
	st, rec, p, _ := setup(t)
	ctx := context.Background()
	t1 := pending(t, st, "proj_a", "r1", 1, 2048)   // only n_small offers tier 1 in r1
	t3 := pending(t, st, "proj_a", "r1", 3, 2048)   // only n_big offers tier 3
	t4 := pending(t, st, "proj_a", "r1", 4, 2048)   // nobody in r1 offers tier 4
	r2 := pending(t, st, "proj_a", "r2", 2, 2048)   // region r2
	big := pending(t, st, "proj_a", "r1", 2, 20000) // only n_big has the memory
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	for id, want := range map[string]string{t1.ID: "n_small", t3.ID: "n_big", r2.ID: "n_other", big.ID: "n_big", t4.ID: ""} {
		if got := rec.nodeOf(id); got != want {
			t.Errorf("%s placed on %q, want %q", id, got, want)
		}
	}
	got, _ := st.Get(ctx, "proj_a", t3.ID)
	if got.State != session.Provisioning || got.NodeID != "n_big" || *got.Zone != "r1-b" {
		t.Fatalf("placement not recorded: %+v", got)
	}
	if got, _ := st.Get(ctx, "proj_a", t4.ID); got.State != session.Pending {
		t.Fatal("unplaceable session left pending")
	}
	// In-flight claims count against capacity before the node's heartbeat shows them:
	// n_small has 4096 MiB; two more 2048 MiB tier-1 sessions fill it (one already placed).
	a := pending(t, st, "proj_a", "r1", 1, 2048)
	b := pending(t, st, "proj_a", "r1", 1, 2048)
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	if (rec.nodeOf(a.ID) == "") == (rec.nodeOf(b.ID) == "") {
		t.Fatalf("capacity not honoured: a→%q b→%q", rec.nodeOf(a.ID), rec.nodeOf(b.ID))
	}
}

// TestPlacementRoundTrips: a placement is on the path of every create, and each round trip to
// Redis is a share of the create's latency: placing one session reads what the round needs
// in two round trips, however many sessions the project runs and nodes there are.
func TestPlacementRoundTrips(t *testing.T) {
	rdb := redistest.Server(t)
	rt := redistest.CountRoundTrips(rdb)
	st, rec, p, _ := setupOn(t, rdb)
	ctx := context.Background()
	for range 5 { // the project runs others (the first round also loads the scripts)
		s := pending(t, st, "proj_a", "r2", 2, 256)
		p.PlaceProject(ctx, "proj_a")
		p.wg.Wait()
		if rec.nodeOf(s.ID) == "" {
			t.Fatalf("%s not placed", s.ID)
		}
	}
	s := pending(t, st, "proj_a", "r2", 2, 256)
	before := rt.Load()
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	got := rt.Load() - before
	if rec.nodeOf(s.ID) != "n_other" {
		t.Fatalf("%s placed on %q, want n_other", s.ID, rec.nodeOf(s.ID))
	}
	// The lock (with its look for pending sessions), the two reads, the claim, the
	// transition (its script and its index pipeline), the round's end.
	const want = 7
	if got > want {
		t.Fatalf("placing one session took %d round trips to Redis, want at most %d", got, want)
	}
	t.Logf("placing one session: %d round trips", got)
}

// TestPlacementSkipsDrainingNodes: a node an operator drains takes no new session (n_big is
// the only one offering tier 3 in r1), and takes them again once the drain ends.
func TestPlacementSkipsDrainingNodes(t *testing.T) {
	st, rec, p, _ := setup(t)
	ctx := context.Background()
	if err := st.SetNodeDraining(ctx, "n_big", true); err != nil {
		t.Fatal(err)
	}
	s := pending(t, st, "proj_a", "r1", 3, 2048)
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	if got := rec.nodeOf(s.ID); got != "" {
		t.Fatalf("placed on draining node %q", got)
	}
	if err := st.SetNodeDraining(ctx, "n_big", false); err != nil {
		t.Fatal(err)
	}
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	if got := rec.nodeOf(s.ID); got != "n_big" {
		t.Fatalf("after the drain ended: placed on %q, want n_big", got)
	}
}

func TestDeadlineAndHostFailure(t *testing.T) {
	st, _, p, now := setup(t)
	ctx := context.Background()
	stuck := pending(t, st, "proj_a", "r1", 4, 1024) // never placeable
	placed := pending(t, st, "proj_a", "r1", 1, 1024)
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	if _, err := st.Transition(ctx, store.Change{Project: "proj_a", ID: placed.ID, From: session.Provisioning, To: session.Running, Driver: session.Node}); err != nil {
		t.Fatal(err)
	}
	tier4, _ := p.Tiers.Tier(4)
	*now = now.Add(tier4.ProvisionDeadline() - time.Second)
	p.Sweep(ctx) // before the deadline; nodes still fresh? heartbeats are older than 5 s now
	if got, _ := st.Get(ctx, "proj_a", stuck.ID); got.State != session.Pending {
		t.Fatalf("failed before its deadline: %s", got.State)
	}
	if got, _ := st.Get(ctx, "proj_a", placed.ID); got.State != session.Failed || *got.StateReason != session.HostFailure {
		t.Fatalf("session on a dead node: %s %v", got.State, got.StateReason)
	}
	*now = now.Add(2 * time.Second)
	p.Sweep(ctx)
	got, _ := st.Get(ctx, "proj_a", stuck.ID)
	if got.State != session.Failed || *got.StateReason != session.ProvisionTimeout {
		t.Fatalf("past the deadline: %s %v", got.State, got.StateReason)
	}
	if n, _ := st.ActiveCount(ctx, "proj_a"); n != 0 {
		t.Fatalf("%d slots leaked", n)
	}
	if nodes, _ := st.Nodes(ctx); len(nodes) != 0 {
		t.Fatalf("dead nodes still registered: %d", len(nodes))
	}
}

func ptr[T any](v T) *T { return &v }

// TestNodeShare: the attack is one project filling a node so that no other project's session
// fits. A project's placed sessions hold at most its plan's share of any node's vCPUs and
// memory; past it, its sessions stay pending while another project's still place.
func TestNodeShare(t *testing.T) {
	st, rec, p, _ := setup(t)
	ctx := context.Background()
	for _, id := range []string{"proj_greedy", "proj_other"} {
		if _, err := st.EnsureProject(ctx, id, id); err != nil {
			t.Fatal(err)
		}
	}
	// n_small (tier 1, 4 vCPU, 4096 MiB) is the only node for tier 1 in r1. At 50 %,
	// proj_greedy gets 2 vCPU and 2048 MiB of it: two 1024 MiB sessions, not three.
	if err := st.SetPlan(ctx, "proj_greedy", store.PlanChange{NodeSharePct: ptr(50)}); err != nil {
		t.Fatal(err)
	}
	var greedy []*session.Session
	for range 3 {
		greedy = append(greedy, pending(t, st, "proj_greedy", "r1", 1, 1024))
	}
	p.PlaceProject(ctx, "proj_greedy")
	p.wg.Wait()
	var waiting []*session.Session
	for _, s := range greedy {
		if rec.nodeOf(s.ID) == "" {
			waiting = append(waiting, s)
		}
	}
	if len(waiting) != 1 {
		t.Fatalf("%d of proj_greedy's 3 sessions wait, want 1 (n_small holds 2 in its 50 %% share)", len(waiting))
	}
	// Another placement round, with the first two placed, still holds the line.
	p.PlaceProject(ctx, "proj_greedy")
	p.wg.Wait()
	if got, _ := st.Get(ctx, "proj_greedy", waiting[0].ID); got.State != session.Pending {
		t.Fatalf("the session past the share is %s on %s, want pending", got.State, got.NodeID)
	}
	other := pending(t, st, "proj_other", "r1", 1, 1024)
	p.PlaceProject(ctx, "proj_other")
	p.wg.Wait()
	if rec.nodeOf(other.ID) != "n_small" {
		t.Fatal("another project's session did not place on the node proj_greedy shares")
	}
	// The operator raises the share: the waiting session places.
	if err := st.SetPlan(ctx, "proj_greedy", store.PlanChange{NodeSharePct: ptr(75)}); err != nil {
		t.Fatal(err)
	}
	p.PlaceProject(ctx, "proj_greedy")
	p.wg.Wait()
	if rec.nodeOf(waiting[0].ID) != "n_small" {
		t.Fatal("not placed after the share grew")
	}
}

// TestNodeShareAcrossPlacers: placers of several gateways placing one project at once still
// keep it within its share of a node: each checks the share against what the others placed.
func TestNodeShareAcrossPlacers(t *testing.T) {
	st, rec, _, now := setup(t)
	ctx := context.Background()
	for round := range 10 {
		// Fresh placers each round, as before the claims were shared (they are in Redis now,
		// and released below).
		p1 := New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: 5 * time.Second, Now: func() time.Time { return *now }})
		p2 := New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: 5 * time.Second, Now: func() time.Time { return *now }})
		project := fmt.Sprintf("proj_race%d", round)
		if _, err := st.EnsureProject(ctx, project, project); err != nil {
			t.Fatal(err)
		}
		// n_small is the only tier-1 node in r1: 4 vCPU, so 2 at 50 %.
		if err := st.SetPlan(ctx, project, store.PlanChange{NodeSharePct: ptr(50)}); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for range 6 {
			ids = append(ids, pending(t, st, project, "r1", 1, 256).ID)
		}
		var wg sync.WaitGroup
		for _, p := range []*Placer{p1, p2, p1, p2} {
			wg.Go(func() { p.PlaceProject(ctx, project) })
		}
		wg.Wait()
		p1.wg.Wait()
		p2.wg.Wait()
		placed := 0
		for _, id := range ids {
			if s, err := st.Get(ctx, project, id); err == nil && s.State != session.Pending {
				placed++
			}
		}
		if placed != 2 {
			t.Fatalf("round %d: %d of the project's 1-vCPU sessions placed on a 4-vCPU node at a 50 %% share; want 2", round, placed)
		}
		// Free the node for the next round.
		for _, id := range ids {
			if s, err := st.Get(ctx, project, id); err == nil && s.State != session.Pending {
				if _, err := st.Transition(ctx, store.Change{Project: project, ID: id, From: s.State, To: session.Failed,
					Driver: session.Node, Reason: session.StartFailure}); err != nil {
					t.Fatal(err)
				}
				// Its claim would count until its window lapses, never on this frozen clock.
				if err := st.ReleaseOnNode(ctx, s.NodeID, store.Claim{Session: s.ID, VCPU: s.Resources.VCPU, MemoryMiB: s.Resources.MemoryMiB}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// TestCapacityAcrossPlacers: placers of two gateways placing two projects at once fill a
// node to its capacity, never past it: each sees the room the other claimed before the
// node's heartbeat shows it.
func TestCapacityAcrossPlacers(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	now := time.Now()
	const n = 4 // n_one holds 4 sessions of 1 vCPU
	var ps []*Placer
	rec := &recorder{placed: map[string]string{}}
	for range 2 {
		st := store.New(rdb) // each gateway its own store, on the one Redis
		ps = append(ps, New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: 5 * time.Second, Now: func() time.Time { return now }}))
	}
	st := ps[0].Store
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "n_one", Region: "r1", Zone: "r1-a", Tiers: []int{1}, VCPU: n, MemoryMiB: 1 << 16}); err != nil {
		t.Fatal(err)
	}
	projects := []string{"proj_a", "proj_b"}
	var ids []store.SessionRef
	for _, project := range projects {
		if _, err := st.EnsureProject(ctx, project, project); err != nil {
			t.Fatal(err)
		}
		if err := st.SetPlan(ctx, project, store.PlanChange{NodeSharePct: ptr(100)}); err != nil {
			t.Fatal(err)
		}
		for range n {
			ids = append(ids, store.SessionRef{Project: project, ID: pending(t, st, project, "r1", 1, 256).ID})
		}
	}
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { p.PlaceProject(ctx, projects[i]) })
	}
	wg.Wait()
	for _, p := range ps {
		p.wg.Wait()
	}
	placed := 0
	for _, ref := range ids {
		s, err := st.Get(ctx, ref.Project, ref.ID)
		if err != nil {
			t.Fatal(err)
		}
		if s.State == session.Provisioning && s.NodeID == "n_one" {
			placed++
		}
	}
	if placed != n {
		t.Fatalf("%d sessions of 1 vCPU provisioning on a %d-vCPU node, want %d", placed, n, n)
	}
}

// TestSweepLeasesAnOrphanSnapshot: a session left in snapshotting with no lease on its
// snapshot (its gateway died before it took one) gets one from the sweep, which a gateway's
// recovery waits on; a lease already there is left as it is.
func TestSweepLeasesAnOrphanSnapshot(t *testing.T) {
	st, _, p, now := setup(t)
	ctx := context.Background()
	s := pending(t, st, "proj_a", "r1", 1, 1024)
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	for _, to := range []session.State{session.Running, session.Snapshotting} {
		from, driver := session.Provisioning, session.Node
		if to == session.Snapshotting {
			from, driver = session.Running, session.Caller
		}
		if _, err := st.Transition(ctx, store.Change{Project: "proj_a", ID: s.ID, From: from, To: to, Driver: driver}); err != nil {
			t.Fatal(err)
		}
	}
	ref := store.SessionRef{Project: "proj_a", ID: s.ID}
	if due, next, err := st.DueSnapshotWork(ctx, now.Add(24*time.Hour), 10); err != nil || len(due) != 0 || !next.IsZero() {
		t.Fatalf("a lease before the sweep: %v %v %v", due, next, err)
	}
	p.Sweep(ctx)
	due, next, err := st.DueSnapshotWork(ctx, now.Add(orphanSnapshotWait-time.Second), 10)
	if err != nil || len(due) != 0 || !next.Equal(now.Add(orphanSnapshotWait).Truncate(time.Millisecond)) {
		t.Fatalf("after the sweep: due %v, next %v (want %v), %v", due, next, now.Add(orphanSnapshotWait), err)
	}
	*now = now.Add(time.Minute)
	p.Sweep(ctx)
	if due, _, _ := st.DueSnapshotWork(ctx, now.Add(orphanSnapshotWait-time.Minute+time.Second), 10); len(due) != 1 || due[0] != ref {
		t.Fatalf("a second sweep moved the lease: due %v", due)
	}
}

// isClaim matches the command of a claim on a node (store.ClaimOnNode), or of a release: its
// keys name the node's claims.
func isClaim(c redis.Cmder) bool {
	return (c.Name() == "evalsha" || c.Name() == "eval") && strings.Contains(fmt.Sprint(c.Args()...), ":claims")
}

// TestCapacityAfterAStaleRead: a placement round reads the nodes' heartbeats once, and a stall
// longer than a heartbeat (2 s) makes that read stale before the round claims: meanwhile
// another placer placed a session on the node, a heartbeat showed it and the next released
// its claim. The round's claims still count that session, from the node's heartbeat as it is
// when they are made: the node is not booked past its capacity.
func TestCapacityAfterAStaleRead(t *testing.T) {
	rdb := redistest.Server(t)
	st, rec, p, _ := setupOn(t, rdb)
	ctx := context.Background()
	// n_small (4 vCPU, 4096 MiB) is the only tier-1 node in r1.
	s1 := pending(t, st, "proj_a", "r1", 1, 2048)
	s2 := pending(t, st, "proj_a", "r1", 1, 2048)
	redistest.BeforeOnce(rdb, isClaim, func() error {
		// Between the round's read and its first claim: another placer places x on n_small,
		// a heartbeat shows x, and the next releases x's claim.
		if _, ok, err := st.ClaimOnNode(ctx, store.ClaimAsk{Node: store.NodeInfo{ID: "n_small", VCPU: 4, MemoryMiB: 4096}, Session: "sess_x", VCPU: 1, MemoryMiB: 2048}, time.Now(), p.claimWindow()); err != nil || !ok {
			t.Errorf("claim x: %v, %v", ok, err)
		}
		if err := st.Heartbeat(ctx, store.NodeInfo{ID: "n_small", Region: "r1", Zone: "r1-a", Tiers: []int{1, 2}, VCPU: 4, MemoryMiB: 4096,
			UsedVCPU: 1, UsedMemoryMiB: 2048}); err != nil {
			return err
		}
		return st.ReleaseOnNode(ctx, "n_small", store.Claim{Session: "sess_x", VCPU: 1, MemoryMiB: 2048})
	})
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	placed := 0
	for _, s := range []*session.Session{s1, s2} {
		if rec.nodeOf(s.ID) == "n_small" {
			placed++
		}
	}
	if placed != 1 {
		t.Fatalf("n_small (4096 MiB) holds x's 2048 MiB and %d more sessions of 2048 MiB; want 1", placed)
	}
}

// TestNodeShareAfterAStaleRead: a placement round reads what its project holds on each node
// once, and a stall makes that read stale before the round claims: meanwhile another placer
// (this one was past its project lock) placed the project's sessions on the node up to its
// share, a heartbeat showed them and the next released their claims. The round's claim
// checks the share against the node's heartbeat as it is then: the project is not placed past
// its share.
func TestNodeShareAfterAStaleRead(t *testing.T) {
	rdb := redistest.Server(t)
	st, rec, p, _ := setupOn(t, rdb)
	ctx := context.Background()
	// n_small (4 vCPU, 4096 MiB) is the only tier-1 node in r1; at 50 %, proj_a holds 2 vCPUs.
	if err := st.SetPlan(ctx, "proj_a", store.PlanChange{NodeSharePct: ptr(50)}); err != nil {
		t.Fatal(err)
	}
	s := pending(t, st, "proj_a", "r1", 1, 512)
	redistest.BeforeOnce(rdb, isClaim, func() error {
		// Between the round's read and its claim: the other placer's two sessions of proj_a
		// on n_small, shown by its heartbeat, their claims released.
		return st.Heartbeat(ctx, store.NodeInfo{ID: "n_small", Region: "r1", Zone: "r1-a", Tiers: []int{1, 2}, VCPU: 4, MemoryMiB: 4096,
			UsedVCPU: 2, UsedMemoryMiB: 1024, Projects: map[string]store.NodeUse{"proj_a": {VCPU: 2, MemoryMiB: 1024}}})
	})
	p.PlaceProject(ctx, "proj_a")
	p.wg.Wait()
	if node := rec.nodeOf(s.ID); node != "" {
		t.Fatalf("%s placed on %s, where proj_a holds its 50 %% share already", s.ID, node)
	}
}

// TestLosingPlacerKeepsTheWinnersClaim: two placers place the same session (one stalled past
// its project lock, 10 s) on the same node. The one whose transition loses releases its own
// claim only: the winner's stays, and holds the session's room on the node until the node's
// heartbeat shows the session.
func TestLosingPlacerKeepsTheWinnersClaim(t *testing.T) {
	rdb := redistest.Server(t)
	st, rec, winner, now := setupOn(t, rdb)
	loser := New(Config{Store: st, Provisioner: rec, HeartbeatTimeout: 5 * time.Second, Now: func() time.Time { return *now }})
	ctx := context.Background()
	s := pending(t, st, "proj_a", "r1", 1, 2048) // only n_small offers tier 1 in r1
	// The winner places s between the loser's read and the loser's claim.
	redistest.BeforeOnce(rdb, isClaim, func() error {
		winner.placeProject(ctx, "proj_a")
		return nil
	})
	loser.placeProject(ctx, "proj_a")
	winner.wg.Wait()
	loser.wg.Wait()
	if got := rec.nodeOf(s.ID); got != "n_small" {
		t.Fatalf("%s placed on %q, want n_small", s.ID, got)
	}
	// What the next round reads (it reads claims only with some session pending).
	pending(t, st, "proj_a", "r1", 4, 1)
	v, err := st.ReadPlacement(ctx, "proj_a", 10, *now, winner.claimWindow(), func(store.NodeInfo) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if c := v.Claims["n_small"]; c != (store.NodeUse{VCPU: 1, MemoryMiB: 2048}) {
		t.Fatalf("claims on n_small, where %s was placed and no heartbeat shows it yet: %+v; want its 1 vCPU and 2048 MiB", s.ID, c)
	}
}

// TestSweepTrimsLapsedSessions: the sweep drops the index entries of a project's ended
// sessions whose retention lapsed, though nothing in the project ended since (endings trim as
// they go; a project gone quiet held its entries for good).
func TestSweepTrimsLapsedSessions(t *testing.T) {
	rdb := redistest.Server(t)
	now := time.Now()
	clock := func() time.Time { return now }
	st := store.New(rdb, store.WithRetention(time.Hour), store.WithClock(clock))
	p := New(Config{Store: st, Provisioner: &recorder{placed: map[string]string{}}, Now: clock})
	ctx := context.Background()
	if _, err := st.EnsureProject(ctx, "proj_q", "q"); err != nil {
		t.Fatal(err)
	}
	var ended []string
	for range 40 {
		s := pending(t, st, "proj_q", "r1", 1, 256)
		if _, err := st.Transition(ctx, store.Change{Project: "proj_q", ID: s.ID, From: session.Pending, To: session.Stopped,
			Driver: session.Caller, Reason: session.Deleted}); err != nil {
			t.Fatal(err)
		}
		ended = append(ended, s.ID)
		rdb.Del(ctx, "wb:{proj_q}:s:"+s.ID)
	}
	all := "wb:{proj_q}:all"
	if n := rdb.ZCard(ctx, all).Val(); n != 40 {
		t.Fatalf("%d sessions indexed before the sweep, want 40", n)
	}
	now = now.Add(time.Hour + time.Second)
	p.Sweep(ctx)
	if n := rdb.ZCard(ctx, all).Val(); n != 0 {
		t.Fatalf("after a sweep, %d of 40 ended sessions whose retention lapsed are still indexed", n)
	}
}
