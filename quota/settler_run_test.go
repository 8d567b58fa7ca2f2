package quota

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/internal/testwait"
	"wb/session"
	"wb/store"
)

// runSettler runs s until the test ends, and waits until it reads usage signals (its
// start sweep is over: what is settled after that came by a signal).
func runSettler(t *testing.T, rdb redis.UniversalClient, s *Settler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, 30*time.Second, "the settler reads usage signals", func() bool {
		groups, _ := rdb.XInfoGroups(context.Background(), "wb:signal:usage").Result()
		return slices.ContainsFunc(groups, func(g redis.XInfoGroup) bool { return g.Name == settlerGroup })
	})
}

// settledMs is the session time the project's hour bucket holds.
func settledMs(rdb redis.UniversalClient, project string) int64 {
	v, _ := rdb.HGet(context.Background(), store.ProjectKeys(project).UsageHour(t0), "t:session_ms").Result()
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// TestSettlerSettlesOnSignal: a record appended while the settler waits is settled at
// once: its signal wakes the settler (no sweep runs in this test after the first).
func TestSettlerSettlesOnSignal(t *testing.T) {
	rdb := redistest.Server(t)
	st := store.New(rdb)
	ctx := context.Background()
	if _, err := st.EnsureProject(ctx, "proj_sig", "sig"); err != nil {
		t.Fatal(err)
	}
	runSettler(t, rdb, NewSettler(rdb, SettlerOptions{Consumer: "c1", FullSweepEvery: time.Hour, AccrueEvery: time.Hour}))
	r := records("proj_sig", []string{"sess_1"}, 1)[0]
	start := time.Now()
	if err := st.AppendUsage(ctx, "proj_sig", r.Values()); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "the record settled", func() bool { return settledMs(rdb, "proj_sig") == 1000 })
	// Nothing but the signal wakes the settler before maxWait: settled well before it.
	if d := time.Since(start); d >= maxWait {
		t.Fatalf("settled %v after the record, want at once", d)
	}
}

// TestSettlersShareSignals: two settlers running at once, records of many projects
// arriving at both: every record is billed once.
func TestSettlersShareSignals(t *testing.T) {
	rdb := redistest.Server(t)
	st := store.New(rdb)
	ctx := context.Background()
	const projects, perSession = 8, 20
	for i := range projects {
		if _, err := st.EnsureProject(ctx, fmt.Sprintf("proj_%d", i), "p"); err != nil {
			t.Fatal(err)
		}
	}
	runSettler(t, rdb, NewSettler(rdb, SettlerOptions{Consumer: "c1", Batch: 7, FullSweepEvery: time.Hour}))
	runSettler(t, rdb, NewSettler(rdb, SettlerOptions{Consumer: "c2", Batch: 7, FullSweepEvery: time.Hour}))
	var wg sync.WaitGroup
	for i := range projects {
		wg.Go(func() {
			for _, r := range records(fmt.Sprintf("proj_%d", i), []string{"sess_a", "sess_b"}, perSession) {
				if err := st.AppendUsage(ctx, r.ProjectID, r.Values()); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range projects {
		p := fmt.Sprintf("proj_%d", i)
		testwait.For(t, 30*time.Second, p+" settled", func() bool { return settledMs(rdb, p) >= 2*perSession*1000 })
	}
	// Both settlers are idle once every signal is acknowledged: then nothing more moves.
	testwait.For(t, 30*time.Second, "every signal acknowledged", func() bool {
		n, _ := rdb.XLen(ctx, "wb:signal:usage").Result()
		return n == 0
	})
	for i := range projects {
		p := fmt.Sprintf("proj_%d", i)
		if got := settledMs(rdb, p); got != 2*perSession*1000 {
			t.Errorf("%s: %d ms of session time billed, want %d", p, got, 2*perSession*1000)
		}
		sess, _ := rdb.HGetAll(ctx, store.ProjectKeys(p).UsageSeq()).Result()
		if sess["sess_a"] != strconv.Itoa(perSession) || sess["sess_b"] != strconv.Itoa(perSession) {
			t.Errorf("%s: settled through %v, want seq %d for both", p, sess, perSession)
		}
	}
}

// TestSettlerStartSweep: records whose signal was lost (appended straight to the stream,
// as a writer that died before signalling leaves them) are settled by the start sweep.
func TestSettlerStartSweep(t *testing.T) {
	rdb := redistest.Server(t)
	st := store.New(rdb)
	ctx := context.Background()
	for _, p := range []string{"proj_lost", "proj_idle"} {
		if _, err := st.EnsureProject(ctx, p, p); err != nil {
			t.Fatal(err)
		}
	}
	appendAll(t, rdb, records("proj_lost", []string{"sess_1"}, 3))
	runSettler(t, rdb, NewSettler(rdb, SettlerOptions{Consumer: "c1", FullSweepEvery: time.Hour}))
	testwait.For(t, 30*time.Second, "the lost records settled", func() bool { return settledMs(rdb, "proj_lost") == 3000 })
}

// TestAccrualVisitsProjectsWithSnapshots: snapshot storage is billed from the index of
// projects with snapshots; a project whose last snapshot is deleted leaves it.
func TestAccrualVisitsProjectsWithSnapshots(t *testing.T) {
	rdb := redistest.Server(t)
	st := store.New(rdb)
	ctx := context.Background()
	snap := session.Snapshot{ID: "snap_1", Object: "snapshot", State: session.SnapshotReady, SizeBytes: 1 << 30, CreatedAt: *session.At(t0)}
	if err := st.PutObject(ctx, "proj_s", store.KindSnapshot, snap.ID, snap); err != nil {
		t.Fatal(err)
	}
	s := NewSettler(rdb, SettlerOptions{})
	if err := s.AccrueSnapshots(ctx, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if acc, _ := rdb.HGet(ctx, store.ProjectKeys("proj_s").SnapshotAccrual(), snap.ID).Int64(); acc != t0.Add(time.Hour).UnixMilli() {
		t.Fatalf("snapshot accrued to %d", acc)
	}
	if err := st.DeleteObject(ctx, "proj_s", store.KindSnapshot, snap.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.AccrueSnapshots(ctx, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if ps, _ := st.SnapshotProjects(ctx); slices.Contains(ps, "proj_s") {
		t.Fatal("a project with no snapshot left stays in the accrual's index")
	}
}
