package quota

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// records makes n records for each of the sessions, one second of running each.
func records(project string, sessions []string, n int) []Record {
	var out []Record
	for i := 1; i <= n; i++ {
		for j, s := range sessions {
			from := t0.Add(time.Duration(i-1) * time.Second)
			out = append(out, Record{SessionID: s, ProjectID: project, EndUserID: fmt.Sprintf("eu_%d", j%2), Tier: 2, SizeClass: "s",
				MemoryMiB: 2048, DiskGiB: 10, Seq: int64(i), FromMs: from.UnixMilli(), ToMs: from.Add(time.Second).UnixMilli(),
				State: session.Running, SessionMs: 1000, CPUMs: 10, MemGiBMs: 500, EgressBytes: 1000})
		}
	}
	return out
}

func appendAll(t testing.TB, rdb redis.UniversalClient, rs []Record) {
	t.Helper()
	ctx := context.Background()
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, r := range rs {
			p.XAdd(ctx, &redis.XAddArgs{Stream: store.ProjectKeys(r.ProjectID).UsageStream(), Values: r.Values()})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func counters(t *testing.T, rdb redis.UniversalClient, project string) map[string]string {
	t.Helper()
	m, err := rdb.HGetAll(context.Background(), store.ProjectKeys(project).Spend()).Result()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := rdb.HGetAll(context.Background(), store.ProjectKeys(project).UsageHour(t0)).Result()
	for k, v := range b {
		m["bucket:"+k] = v
	}
	return m
}

func TestCost(t *testing.T) {
	p := DefaultPrices()
	r := Record{Tier: 2, SizeClass: "s", SessionMs: 1500}
	if got := p.Cost(r); got != 1500*28 {
		t.Fatalf("running cost %d", got)
	}
	paused := Record{Tier: 2, SizeClass: "s", MemoryMiB: 2048, DiskGiB: 10, PausedMs: msPerMonth}
	if got := p.Cost(paused); got != 12*100_000*1000 {
		t.Fatalf("a month paused with 12 GiB: %d nano", got)
	}
	if got := p.Cost(Record{EgressBytes: 2_000_000_000}); got != 2*50_000*1000 {
		t.Fatalf("2 GB egress: %d", got)
	}
	if got := p.Cost(Record{Tier: 1, SizeClass: "custom", SessionMs: 1000}); got != 28*1000 {
		t.Fatalf("unpriced size pays the tier's largest: %d", got)
	}
}

// Exactly once: a settler that dies mid-stream (reads, settles part, never acks) and a new
// one that replays everything end with the counters of a clean run.
func TestSettlerExactlyOnce(t *testing.T) {
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.New(t)
			rs := records("proj_a", []string{"sess_1", "sess_2", "sess_3"}, 40)
			// Clean run on project b with the same records.
			clean := make([]Record, len(rs))
			for i, r := range rs {
				r.ProjectID = "proj_b"
				clean[i] = r
			}
			appendAll(t, rdb, rs)
			appendAll(t, rdb, clean)
			s := NewSettler(rdb, SettlerOptions{Consumer: "c1", Batch: 50})
			if n, err := s.SettleProject(ctx, "proj_b"); err != nil || n == 0 {
				t.Fatalf("clean: %d %v", n, err)
			}
			for n, err := s.SettleProject(ctx, "proj_b"); n > 0; n, err = s.SettleProject(ctx, "proj_b") {
				if err != nil {
					t.Fatal(err)
				}
			}
			// Crash: a settler applies half a batch's worth and dies before acking.
			if err := s.ensureGroup(ctx, "proj_a"); err != nil {
				t.Fatal(err)
			}
			res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: settlerGroup, Consumer: "dead", Streams: []string{store.ProjectKeys("proj_a").UsageStream(), ">"}, Count: 60}).Result()
			if err != nil {
				t.Fatal(err)
			}
			half := NewSettler(rdb, SettlerOptions{Consumer: "dead"})
			partial := res[0].Messages[:30]
			if err := half.apply(ctx, "proj_a", half.runs("proj_a", partial)); err != nil {
				t.Fatal(err)
			}
			restarted := NewSettler(rdb, SettlerOptions{Consumer: "dead"}) // same consumer name: reads its own pending first
			for i := 0; i < 20; i++ {
				if _, err := restarted.SettleProject(ctx, "proj_a"); err != nil {
					t.Fatal(err)
				}
			}
			// And a second settler reads the stream from the start again (another group
			// member's view after XAUTOCLAIM): nothing changes (the settled records are
			// trimmed, and any left would be replays).
			if err := rdb.XGroupDestroy(ctx, store.ProjectKeys("proj_a").UsageStream(), settlerGroup).Err(); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 20; i++ {
				if _, err := NewSettler(rdb, SettlerOptions{Consumer: "c2"}).SettleProject(ctx, "proj_a"); err != nil {
					t.Fatal(err)
				}
			}
			a, bb := counters(t, rdb, "proj_a"), counters(t, rdb, "proj_b")
			if len(a) == 0 || fmt.Sprint(a) != fmt.Sprint(bb) {
				t.Fatalf("replayed counters differ from a clean run:\n%v\n%v", a, bb)
			}
			want := int64(3*40*(1000*28+1000*50_000/1_000_000)) / 1000 // running + egress
			if got, _ := NewAccounts(rdb).Spend(ctx, "proj_a", "", t0); got != want {
				t.Fatalf("spend %d micro-USD, want %d", got, want)
			}
			if pending, _ := rdb.XPending(ctx, store.ProjectKeys("proj_a").UsageStream(), settlerGroup).Result(); pending.Count != 0 {
				t.Fatalf("%d records left unacknowledged", pending.Count)
			}
		})
	}
}

func TestSettlerUpdatesSessionAndReport(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	if _, err := st.EnsureProject(ctx, "proj_r", "r"); err != nil {
		t.Fatal(err)
	}
	eu := "eu_0"
	sess := &session.Session{ID: "sess_r1", ProjectID: "proj_r", Tier: 2, State: session.Pending, EndUserID: &eu,
		CreatedAt: *session.At(t0), IdleTimeoutS: 300, MaxLifetimeS: 3600}
	if _, err := st.Create(ctx, sess, 10); err != nil {
		t.Fatal(err)
	}
	rs := records("proj_r", []string{"sess_r1"}, 5)
	rs = append(rs, Record{SessionID: "sess_r1", ProjectID: "proj_r", EndUserID: eu, Tier: 2, SizeClass: "s", MemoryMiB: 2048, DiskGiB: 10,
		Seq: 6, FromMs: t0.Add(5 * time.Second).UnixMilli(), ToMs: t0.Add(65 * time.Second).UnixMilli(), State: session.Paused, PausedMs: 60_000})
	appendAll(t, rdb, rs)
	done := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	go func() { _ = NewSettler(rdb, SettlerOptions{}).Run(cctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	var got *session.Session
	for time.Now().Before(deadline) {
		got, _ = st.Get(ctx, "proj_r", "sess_r1")
		if got.UsageToDate.SessionS == 5 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got.UsageToDate.SessionS != 5 || got.UsageToDate.CPUMs != 50 || got.UsageToDate.EgressBytes != 5000 {
		t.Fatalf("usage_to_date %+v", got.UsageToDate)
	}
	rep, err := NewAccounts(rdb).Report(ctx, "proj_r", t0, t0.Add(time.Hour), "session")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Data) != 1 || rep.Data[0].SessionS != 5 || rep.Data[0].PausedS != 60 || rep.Totals.SessionS != 5 {
		t.Fatalf("report %+v", rep)
	}
	pausedNano := int64(60_000) * 12 * 100_000 * 1000 / msPerMonth
	if want := (5*(1000*28+50) + pausedNano) / 1000; rep.Totals.CostMicro != want {
		t.Fatalf("cost %d, want %d", rep.Totals.CostMicro, want)
	}
	byEU, _ := NewAccounts(rdb).Report(ctx, "proj_r", t0, t0.Add(time.Hour), "end_user")
	if len(byEU.Data) != 1 || byEU.Data[0].EndUserID != eu {
		t.Fatalf("by end user %+v", byEU)
	}
	for _, bad := range []struct {
		from, to time.Time
		g        string
	}{{t0, t0, "session"}, {t0, t0.Add(time.Hour), "tier"}, {t0, t0.Add(100 * 24 * time.Hour), "session"}} {
		if _, err := NewAccounts(rdb).Report(ctx, "proj_r", bad.from, bad.to, bad.g); err == nil {
			t.Errorf("report %v accepted", bad)
		}
	}
}

func TestCaps(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	var mu sync.Mutex
	var events []CapEvent
	caps := NewCaps(rdb, func(_ context.Context, ev CapEvent) {
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
	}, nil)
	// 28 micro-USD per record; project cap 1000 → soft at 800 (record 29), hard at 1000 (record 36).
	if err := NewAccounts(rdb).SetLimits(ctx, "proj_c", Limits{MonthlySpendCapMicroUSD: 1000, EndUserMonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	if err := NewAccounts(rdb).SetLimits(ctx, "proj_c", Limits{MonthlySpendCapMicroUSD: -1}); err == nil {
		t.Fatal("negative cap accepted")
	}
	appendAll(t, rdb, records("proj_c", []string{"sess_c"}, 50))
	s := NewSettler(rdb, SettlerOptions{Caps: caps, Batch: 7})
	for i := 0; i < 20; i++ {
		if _, err := s.SettleProject(ctx, "proj_c"); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	got := map[string]int{}
	for _, ev := range events {
		got[ev.Scope+"/"+ev.Level]++
	}
	// Each cap fires hard exactly once; soft at most once, and not when one batch crossed both.
	if got["project/hard"] != 1 || got["end_user/hard"] != 1 || got["project/soft"] > 1 || got["end_user/soft"] > 1 {
		t.Fatalf("cap events %v", events)
	}
	if scope, soft, _ := NewAccounts(rdb).CapState(ctx, "proj_c", "eu_0", t0); scope != "project" || !soft {
		t.Fatalf("capped scope %q soft %v", scope, soft)
	}
	if scope, soft, _ := NewAccounts(rdb).CapState(ctx, "proj_other", "", t0); scope != "" || soft {
		t.Fatal("another project capped")
	}
}

// Raising the end-user cap lifts the admission stop of each end user whose spend this month
// is now under it, and only theirs: the way out of a spend-cap stop is to raise the cap.
func TestRaisedEndUserCapLiftsItsStops(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	accounts := NewAccounts(rdb)
	const project = "proj_eu"
	// 28 µUSD per record: eu_low spends 112, eu_high 1,120; both cross the cap of 100.
	var rs []Record
	for eu, n := range map[string]int{"eu_low": 4, "eu_high": 40} {
		for _, r := range records(project, []string{"sess_" + eu}, n) {
			r.EndUserID = eu
			rs = append(rs, r)
		}
	}
	appendAll(t, rdb, rs)
	if err := accounts.SetLimits(ctx, project, Limits{EndUserMonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	s := NewSettler(rdb, SettlerOptions{Caps: NewCaps(rdb, nil, nil), Batch: 7})
	for n, err := s.SettleProject(ctx, project); n > 0 || err != nil; n, err = s.SettleProject(ctx, project) {
		if err != nil {
			t.Fatal(err)
		}
	}
	stopped := func(endUser string) bool {
		t.Helper()
		scope, _, err := accounts.CapState(ctx, project, endUser, t0)
		if err != nil {
			t.Fatal(err)
		}
		return scope == "end_user"
	}
	if !stopped("eu_low") || !stopped("eu_high") {
		t.Fatal("the end users over the cap of 100 µUSD were not stopped")
	}
	// What PUT /v1/limits does.
	raise := func(capMicroUSD int64) {
		t.Helper()
		if err := accounts.SetLimits(ctx, project, Limits{EndUserMonthlySpendCapMicroUSD: capMicroUSD}); err != nil {
			t.Fatal(err)
		}
		if err := accounts.Uncap(ctx, project, 0, t0); err != nil {
			t.Fatal(err)
		}
		if err := accounts.UncapEndUsers(ctx, project, capMicroUSD, t0); err != nil {
			t.Fatal(err)
		}
	}
	raise(1000)
	if stopped("eu_low") {
		t.Error("eu_low (spend 112 µUSD) still stopped after the end-user cap was raised to 1,000")
	}
	if _, soft, _ := accounts.CapState(ctx, project, "eu_low", t0); soft {
		t.Error("eu_low (spend 112 µUSD) still marked past the soft cap of 800")
	}
	if !stopped("eu_high") {
		t.Error("eu_high (spend 1,120 µUSD) admitted again under a cap of 1,000")
	}
	raise(1_000_000)
	if stopped("eu_high") {
		t.Error("eu_high (spend 1,120 µUSD) still stopped after the end-user cap was raised to 1,000,000")
	}
}

// BenchmarkSettler: records settled per second from one project's stream, against a local
// redis-server (the records are appended first, outside the clock).
func BenchmarkSettler(b *testing.B) {
	ctx := context.Background()
	rdb := redistest.Server(b)
	var sessions []string
	for i := 0; i < 100; i++ {
		sessions = append(sessions, fmt.Sprintf("sess_%03d", i))
	}
	rs := records("proj_bench", sessions, (b.N+99)/100)
	appendAll(b, rdb, rs)
	s := NewSettler(rdb, SettlerOptions{Batch: 1000})
	b.ResetTimer()
	start := time.Now()
	total := 0
	for total < len(rs) {
		n, err := s.SettleProject(ctx, "proj_bench")
		if err != nil {
			b.Fatal(err)
		}
		total += n
	}
	b.ReportMetric(float64(total)/time.Since(start).Seconds(), "records/s")
}

// Snapshot storage bills snapshot_gib_month for as long as the snapshot is kept, once.
func TestSnapshotStorage(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	if _, err := st.EnsureProject(ctx, "proj_s", "s"); err != nil {
		t.Fatal(err)
	}
	snap := session.Snapshot{ID: "snap_1", Object: "snapshot", State: session.SnapshotReady, SizeBytes: 2 << 30, CreatedAt: *session.At(t0)}
	if err := st.PutObject(ctx, "proj_s", store.KindSnapshot, snap.ID, snap); err != nil {
		t.Fatal(err)
	}
	failed := session.Snapshot{ID: "snap_2", Object: "snapshot", State: session.SnapshotFailed, SizeBytes: 1 << 30, CreatedAt: *session.At(t0)}
	_ = st.PutObject(ctx, "proj_s", store.KindSnapshot, failed.ID, failed)
	s := NewSettler(rdb, SettlerOptions{})
	// Half a month in three steps, one of them repeated: 2 GiB × 0.5 month × 20,000 µUSD.
	for _, at := range []time.Duration{msPerMonth / 6, msPerMonth / 3, msPerMonth / 3, msPerMonth / 2} {
		if err := s.AccrueSnapshots(ctx, t0.Add(at*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := NewAccounts(rdb).Spend(ctx, "proj_s", "", t0.Add(msPerMonth/2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(2 * 20_000 / 2); got < want-1 || got > want {
		t.Fatalf("snapshot storage billed %d µUSD, want %d", got, want)
	}
}

// TestSettlerRetriesAProjectWhoseLockIsHeld: a usage signal for a project whose settlement
// lock another settler holds is read again until this settler gets the lock, not
// acknowledged: a holder whose round died (its Redis primary killed mid-round) never makes
// the round it was asked for, and a chaos test's last records stayed unsettled until the
// next full sweep, minutes later.
func TestSettlerRetriesAProjectWhoseLockIsHeld(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	const project = "proj_held"
	if lock, err := store.New(rdb).LockSettlement(ctx, project); err != nil || lock == nil {
		t.Fatalf("take the lock as the dead settler: %v, %v", lock, err)
	}
	s := NewSettler(rdb, SettlerOptions{Consumer: "alive", FullSweepEvery: time.Hour})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(rctx) }()
	defer func() { cancel(); <-done }()
	appendAll(t, rdb, records(project, []string{"sess_held"}, 3))
	if err := store.New(rdb).Signal(ctx, store.WorkUsage, project); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(store.PlacementLease + 30*time.Second)
	for len(counters(t, rdb, project)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the records were not settled %v after the dead settler's lock ran out", 30*time.Second)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSettlerAcknowledgesDeletedSignals: a usage signal deleted from the stream while this
// settler held it unacknowledged (XADD's MAXLEN trims the oldest entries, pending or not) is
// answered by its reads of its own pending signals with no project, at once, before any new
// signal. Left unacknowledged, every read answered it alone again: the settler spun on it and
// settled a new signal's records only at its next full sweep.
func TestSettlerAcknowledgesDeletedSignals(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	st := store.New(rdb)
	const consumer = "alive"
	if err := st.Signal(ctx, store.WorkUsage, "proj_trimmed"); err != nil {
		t.Fatal(err)
	}
	sigs, err := st.Signals(ctx, store.WorkUsage, settlerGroup, consumer, 0, 64)
	if err != nil || len(sigs) != 1 {
		t.Fatalf("read the signal to leave it pending: %v, %v", sigs, err)
	}
	if err := rdb.XDel(ctx, "wb:signal:"+string(store.WorkUsage), sigs[0].ID).Err(); err != nil {
		t.Fatal(err)
	}
	s := NewSettler(rdb, SettlerOptions{Consumer: consumer, FullSweepEvery: time.Hour})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(rctx) }()
	defer func() { cancel(); <-done }()
	const project = "proj_after"
	appendAll(t, rdb, records(project, []string{"sess_after"}, 3))
	if err := st.Signal(ctx, store.WorkUsage, project); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(counters(t, rdb, project)) == 0 {
		if time.Now().After(deadline) {
			pending, _ := rdb.XPending(ctx, "wb:signal:"+string(store.WorkUsage), settlerGroup).Result()
			t.Fatalf("a signalled project's records not settled in 30 s beside a signal deleted while pending (the group's pending signals: %+v)", pending)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// beforeFirstScript runs once, just before the first script its client sends: the moment
// between an accrual's read of the last accrued time and its script.
type beforeFirstScript struct{ once func() }

func (h *beforeFirstScript) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *beforeFirstScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && h.once != nil {
			f := h.once
			h.once = nil
			f()
		}
		return next(ctx, cmd)
	}
}

func (h *beforeFirstScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Two settlers accrue one snapshot at once (every gateway runs one, and accrual takes no
// lock): B's whole accrual lands between A's read of the last accrued time and A's script.
// The overlap is billed once: A bills only from where B left off.
func TestConcurrentAccrualBillsOnce(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	if _, err := st.EnsureProject(ctx, "proj_s", "s"); err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	snap := session.Snapshot{ID: "snap_1", Object: "snapshot", State: session.SnapshotReady, SizeBytes: 2 << 30, CreatedAt: *session.At(created)}
	if err := st.PutObject(ctx, "proj_s", store.KindSnapshot, snap.ID, snap); err != nil {
		t.Fatal(err)
	}
	ca := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr})
	defer ca.Close()
	hook := &beforeFirstScript{}
	ca.AddHook(hook)
	if err := accrueScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	a, b := NewSettler(ca, SettlerOptions{}), NewSettler(rdb, SettlerOptions{})
	// A fifth of a month, twice, stays in the month the snapshot was made in.
	step := msPerMonth / 5 * time.Millisecond
	last := created // what A reads: never accrued, then accrued before
	for _, name := range []string{"never accrued", "accrued before"} {
		t.Run(name, func(t *testing.T) {
			before, err := NewAccounts(rdb).Spend(ctx, "proj_s", "", created)
			if err != nil {
				t.Fatal(err)
			}
			bTo := last.Add(step)
			hook.once = func() {
				if err := b.accrue(ctx, "proj_s", snap.ID, snap.SizeBytes, created, bTo); err != nil {
					t.Error(err)
				}
			}
			aTo := bTo.Add(time.Second)
			last = aTo
			if err := a.accrue(ctx, "proj_s", snap.ID, snap.SizeBytes, created, aTo); err != nil {
				t.Fatal(err)
			}
			after, err := NewAccounts(rdb).Spend(ctx, "proj_s", "", created)
			if err != nil {
				t.Fatal(err)
			}
			// A fifth of a month (and a second) of 2 GiB at 20,000 µUSD per GiB-month.
			if got, want := after-before, int64(2*20_000/5); got < want-1 || got > want+1 {
				t.Fatalf("a fifth of a month of a 2 GiB snapshot billed %d µUSD, want %d", got, want)
			}
			if got, _ := rdb.HGet(ctx, store.ProjectKeys("proj_s").SnapshotAccrual(), snap.ID).Int64(); got != aTo.UnixMilli() {
				t.Fatalf("accrued up to %d, want %d", got, aTo.UnixMilli())
			}
		})
	}
}

// TestSettlerTrimsSettledUsage: the settler removes the usage records it has settled from
// the project's stream, which otherwise grows by a record every few seconds per session for
// ever; a record another settler read and never acknowledged (it died) stays until it is
// settled, and nothing is lost: the totals are those of a clean run.
func TestSettlerTrimsSettledUsage(t *testing.T) {
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.New(t)
			const project, clean = "proj_trim", "proj_trim_clean"
			stream := store.ProjectKeys(project).UsageStream()
			xlen := func() int64 {
				t.Helper()
				n, err := rdb.XLen(ctx, stream).Result()
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			rs := records(project, []string{"sess_1", "sess_2"}, 30) // 60 records
			first, later := rs[:20], rs[20:]
			cleanRs := make([]Record, len(rs))
			for i, r := range rs {
				r.ProjectID = clean
				cleanRs[i] = r
			}
			appendAll(t, rdb, cleanRs)
			if _, err := NewSettler(rdb, SettlerOptions{Consumer: "c0"}).SettleProject(ctx, clean); err != nil {
				t.Fatal(err)
			}

			alive := NewSettler(rdb, SettlerOptions{Consumer: "alive", Batch: 8})
			appendAll(t, rdb, first)
			if n, err := alive.SettleProject(ctx, project); err != nil || n != len(first) {
				t.Fatalf("settled %d of %d: %v", n, len(first), err)
			}
			if n := xlen(); n != 0 {
				t.Fatalf("%d settled records left in the stream", n)
			}
			// A settler reads 10 records and dies. The alive one's first batch claims 8 of them
			// (the oldest first), settles them and trims: the other 2 stay.
			appendAll(t, rdb, later)
			res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: settlerGroup, Consumer: "dead",
				Streams: []string{stream, ">"}, Count: 10, Block: -1}).Result()
			if err != nil || len(res) != 1 || len(res[0].Messages) != 10 {
				t.Fatalf("the dead settler's read: %v, %v", res, err)
			}
			dead := res[0].Messages
			if n, err := alive.settleBatch(ctx, project); err != nil || n != 8 {
				t.Fatalf("first batch settled %d: %v", n, err)
			}
			if n := xlen(); n != int64(len(later)-8) {
				t.Fatalf("stream holds %d records, want the %d not settled", n, len(later)-8)
			}
			left, err := rdb.XRange(ctx, stream, dead[8].ID, dead[9].ID).Result()
			if err != nil || len(left) != 2 {
				t.Fatalf("the dead settler's unclaimed records: %d of 2 left, %v", len(left), err)
			}
			if waiting, err := alive.unsettled(ctx, []string{project}); err != nil || len(waiting) != 1 {
				t.Fatalf("the sweep finds %v waiting, %v", waiting, err)
			}
			// The rest is settled, and the stream is left empty.
			if _, err := alive.SettleProject(ctx, project); err != nil {
				t.Fatal(err)
			}
			if n := xlen(); n != 0 {
				t.Fatalf("%d settled records left in the stream", n)
			}
			if a, c := counters(t, rdb, project), counters(t, rdb, clean); len(a) == 0 || fmt.Sprint(a) != fmt.Sprint(c) {
				t.Fatalf("settled counters differ from a clean run:\n%v\n%v", a, c)
			}
			// A record appended after the trim is still seen by the sweep and settled.
			extra := records(project, []string{"sess_3"}, 1)
			appendAll(t, rdb, extra)
			if waiting, err := alive.unsettled(ctx, []string{project}); err != nil || len(waiting) != 1 {
				t.Fatalf("after a trim, the sweep finds %v waiting, %v", waiting, err)
			}
			if n, err := alive.SettleProject(ctx, project); err != nil || n != 1 || xlen() != 0 {
				t.Fatalf("settled %d, %v; %d left", n, err, xlen())
			}
		})
	}
}

// A crossed cap's stops run once the settler has released the project's settlement lock: node
// calls may outlast the lock's lease (which nothing renews meanwhile), and a second settler
// would then settle the project alongside the first, counting records out of order.
func TestCapStopsRunOutsideTheSettlementLock(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	const project = "proj_lock"
	var fired, held int
	caps := NewCaps(rdb, func(ctx context.Context, ev CapEvent) {
		fired++
		// What a second settler does while the cap's stops run.
		lock, err := st.LockSettlement(ctx, project)
		if err != nil {
			t.Error(err)
			return
		}
		if lock == nil {
			held++
			return
		}
		if err := lock.Release(ctx); err != nil {
			t.Error(err)
		}
	}, nil)
	if err := NewAccounts(rdb).SetLimits(ctx, project, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	appendAll(t, rdb, records(project, []string{"sess_l"}, 10)) // 280 µUSD: both levels crossed
	if _, err := NewSettler(rdb, SettlerOptions{Caps: caps, Batch: 2}).SettleProject(ctx, project); err != nil {
		t.Fatal(err)
	}
	if fired == 0 {
		t.Fatal("no cap crossed")
	}
	if held > 0 {
		t.Fatalf("%d of %d cap events were acted on while the settler held the project's settlement lock", held, fired)
	}
}

// A snapshot whose accrual fails leaves the others billed, in its project and in the rest:
// the failure is answered (and the settler logs it), and the snapshot is billed on a later
// run. It used to end the run, and every snapshot after it went unbilled while it failed.
func TestAccrualGoesOnPastAFailedSnapshot(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	// In each project, a good snapshot either side of a failing one (snap_b, snap_e), in
	// whatever order the projects and their snapshots are visited.
	snaps := map[string][]string{"proj_acc1": {"snap_a", "snap_b", "snap_c"}, "proj_acc2": {"snap_d", "snap_e", "snap_f"}}
	for p, ids := range snaps {
		for _, id := range ids {
			snap := session.Snapshot{ID: id, Object: "snapshot", State: session.SnapshotReady, SizeBytes: 2 << 30, CreatedAt: *session.At(t0)}
			if err := st.PutObject(ctx, p, store.KindSnapshot, id, snap); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Their accruals fail: their marks are unreadable.
	for p, id := range map[string]string{"proj_acc1": "snap_b", "proj_acc2": "snap_e"} {
		if err := rdb.HSet(ctx, store.ProjectKeys(p).SnapshotAccrual(), id, "garbage").Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := NewSettler(rdb, SettlerOptions{})
	at := t0.Add(msPerMonth / 2 * time.Millisecond)
	accrueErr := s.AccrueSnapshots(ctx, at)
	for p, ids := range snaps {
		got, err := NewAccounts(rdb).Spend(ctx, p, "", at)
		if err != nil {
			t.Fatal(err)
		}
		// 2 GiB × half a month × 20,000 µUSD per GiB-month, per snapshot billed.
		if want := int64(2 * 20_000); got < want-1 || got > want {
			t.Errorf("%s (snapshots %v) billed %d µUSD, want %d: its two good snapshots", p, ids, got, want)
		}
	}
	if accrueErr == nil || !strings.Contains(accrueErr.Error(), "snap_b") || !strings.Contains(accrueErr.Error(), "snap_e") {
		t.Fatalf("accrual answered %v, want snap_b's and snap_e's failures", accrueErr)
	}
}

// cancelAfterFlag cancels a context once a cap's flag has been set (flagScript).
type cancelAfterFlag struct{ cancel context.CancelFunc }

func (cancelAfterFlag) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h cancelAfterFlag) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); err == nil && (n == "evalsha" || n == "eval") && slices.ContainsFunc(cmd.Args(), func(a any) bool {
			s, ok := a.(string)
			return ok && (strings.Contains(s, ":capped:hard:") || strings.Contains(s, ":capped:soft:"))
		}) {
			h.cancel()
		}
		return err
	}
}
func (cancelAfterFlag) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCapActsThoughTheSettleIsCut: a settle whose context ends once it has flagged a cap (a
// shutdown) still decides the cap's stops: the flag is set once a month, so stops skipped
// then would never run (they ran under the settle's ended context and failed at once).
func TestCapActsThoughTheSettleIsCut(t *testing.T) {
	rdb := redistest.Server(t)
	const project = "proj_cut"
	if err := NewAccounts(rdb).SetLimits(context.Background(), project, Limits{MonthlySpendCapMicroUSD: 100}); err != nil {
		t.Fatal(err)
	}
	appendAll(t, rdb, records(project, []string{"sess_c"}, 10)) // 280 µUSD: both levels crossed
	var fired, cut int
	caps := NewCaps(rdb, func(ctx context.Context, ev CapEvent) {
		fired++
		if ctx.Err() != nil {
			cut++
		}
	}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb.AddHook(cancelAfterFlag{cancel})
	_, _ = NewSettler(rdb, SettlerOptions{Caps: caps, Batch: 2}).SettleProject(ctx, project)
	if fired == 0 {
		t.Fatal("no cap crossed")
	}
	if ctx.Err() == nil {
		t.Fatal("the settle was not cut once it flagged a cap: the test no longer cuts it")
	}
	if cut > 0 {
		t.Errorf("%d of %d cap events were decided under the settle's ended context", cut, fired)
	}
}

// awayFor fails every command naming a key that ends in suffix, once armed, as a partitioned
// Redis does: after a dial's wait, with a dial's error. It counts them.
type awayFor struct {
	suffix string
	wait   time.Duration
	armed  atomic.Bool
	calls  atomic.Int64
}

func (h *awayFor) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *awayFor) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() && slices.ContainsFunc(cmd.Args(), func(a any) bool { s, ok := a.(string); return ok && strings.HasSuffix(s, h.suffix) }) {
			h.calls.Add(1)
			time.Sleep(h.wait)
			cmd.SetErr(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

func (h *awayFor) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// An accrual round ends early when Redis is clearly away (connection errors one after the
// other), and answers a bounded error: each snapshot's accrual waited for its own dial timeout
// (and go-redis's retries), so a partition held the settler's loop for snapshots × timeout,
// and the answer joined an error per snapshot.
func TestAccrualRoundEndsWhenRedisIsAway(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	const perProject = 20
	for _, p := range []string{"proj_away1", "proj_away2"} {
		for i := 0; i < perProject; i++ {
			id := fmt.Sprintf("snap_%s_%02d", p, i)
			snap := session.Snapshot{ID: id, Object: "snapshot", State: session.SnapshotReady, SizeBytes: 1 << 30, CreatedAt: *session.At(t0)}
			if err := st.PutObject(ctx, p, store.KindSnapshot, id, snap); err != nil {
				t.Fatal(err)
			}
		}
	}
	hook := &awayFor{suffix: ":snapacc", wait: 20 * time.Millisecond}
	rdb.AddHook(hook)
	hook.armed.Store(true)
	err := NewSettler(rdb, SettlerOptions{}).AccrueSnapshots(ctx, t0.Add(time.Hour))
	if err == nil {
		t.Fatal("accrual answered no error while Redis was away")
	}
	if n := hook.calls.Load(); n > 5 {
		t.Errorf("the round sent %d commands to a Redis that was away (of %d snapshots), want it to end after a few", n, 2*perProject)
	}
	if lines := strings.Count(err.Error(), "\n") + 1; lines > 10 {
		t.Errorf("the round answered %d lines of errors, want a few:\n%v", lines, err)
	}
	// Redis back, and every accrual of a project failing on its own (unreadable marks): the
	// round goes on through them, and names a few.
	hook.armed.Store(false)
	for i := 0; i < perProject; i++ {
		if err := rdb.HSet(ctx, store.ProjectKeys("proj_away1").SnapshotAccrual(), fmt.Sprintf("snap_proj_away1_%02d", i), "garbage").Err(); err != nil {
			t.Fatal(err)
		}
	}
	err = NewSettler(rdb, SettlerOptions{}).AccrueSnapshots(ctx, t0.Add(time.Hour))
	if err == nil {
		t.Fatal("accrual answered no error while every snapshot of proj_away1 failed")
	}
	if lines := strings.Count(err.Error(), "\n") + 1; lines > 10 || !strings.Contains(err.Error(), "more") {
		t.Errorf("the round answered %d lines of errors, want a few and a count of the rest:\n%v", lines, err)
	}
	if spend, err := NewAccounts(rdb).Spend(ctx, "proj_away2", "", t0.Add(time.Hour)); err != nil || spend == 0 {
		t.Errorf("proj_away2 billed %d µUSD (%v) in the round after, want its snapshots' storage", spend, err)
	}
}
