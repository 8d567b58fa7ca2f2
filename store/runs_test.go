package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
)

// TestRunExpires: a run is readable under its own key, to which each write gives the store's
// retention as TTL (Redis drops it, output and all, past that), on every backend.
func TestRunExpires(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t), WithRetention(time.Hour))
			run := &session.Run{ID: "run_1", Object: "run", State: session.RunQueued}
			if err := s.PutRun(ctx, "proj_r", run); err != nil {
				t.Fatal(err)
			}
			run.State, run.Stdout = session.RunSucceeded, "out"
			if err := s.PutRun(ctx, "proj_r", run); err != nil {
				t.Fatal(err)
			}
			got, err := s.GetRun(ctx, "proj_r", "run_1")
			if err != nil || got.State != session.RunSucceeded || got.Stdout != "out" {
				t.Fatalf("GetRun: %+v, %v; want the run as last written", got, err)
			}
			key := ProjectKeys("proj_r").run("run_1")
			if ttl, err := s.rdb.TTL(ctx, key).Result(); err != nil || ttl <= 59*time.Minute || ttl > time.Hour {
				t.Fatalf("TTL of %s: %v, %v; want the retention (1h)", key, ttl, err)
			}
			if _, err := s.GetRun(ctx, "proj_other", "run_1"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("another project's run: %v, want ErrNotFound", err)
			}
		})
	}
}

// TestCreateRunOnce: of two attempts at one run id, the first creates the record and owns
// it; the second is told it exists and changes nothing. The owner is never part of the run
// as the API shows it.
func TestCreateRunOnce(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			first := &session.Run{ID: "run_1", Object: "run", State: session.RunQueued, Stdout: "first"}
			if created, err := s.CreateRun(ctx, "proj_r", first, "lease_a"); err != nil || !created {
				t.Fatalf("the first create: %v, %v; want created", created, err)
			}
			second := &session.Run{ID: "run_1", Object: "run", State: session.RunQueued, Stdout: "second"}
			if created, err := s.CreateRun(ctx, "proj_r", second, "lease_b"); err != nil || created {
				t.Fatalf("the second create: %v, %v; want not created", created, err)
			}
			got, owner, err := s.GetRunOwner(ctx, "proj_r", "run_1")
			if err != nil || got.Stdout != "first" || owner != "lease_a" {
				t.Fatalf("GetRunOwner: %+v, %q, %v; want the first attempt's run, owned by lease_a", got, owner, err)
			}
			raw, err := json.Marshal(got)
			if err != nil || strings.Contains(string(raw), "lease_a") {
				t.Fatalf("the run as the API shows it names its owner: %s", raw)
			}
		})
	}
}

// TestRunWrites: the owner records its run running only while it is queued and its own; a
// recovery records it failed only in the state it read, with its run.finished in the same
// write, after which the owner can neither start it nor end it (its end is refused, and
// announces nothing: a run's end goes out once). The owner's end of a run that has not ended
// is written with its event. On every backend.
func TestRunWrites(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			sess := "sess_1"
			run := &session.Run{ID: "run_1", Object: "run", SessionID: &sess, State: session.RunQueued}
			if _, err := s.CreateRun(ctx, "proj_r", run, "lease_a"); err != nil {
				t.Fatal(err)
			}
			running := *run
			running.State = session.RunRunning
			if ok, err := s.StartRun(ctx, "proj_r", &running, "lease_b"); err != nil || ok {
				t.Fatalf("another attempt's start: %v, %v; want refused", ok, err)
			}
			failed := *run
			failed.State = session.RunFailed
			if ok, err := s.FailRun(ctx, "proj_r", &failed, "lease_a", session.RunRunning, &failed); err != nil || ok {
				t.Fatalf("a fail from running of a queued run: %v, %v; want refused", ok, err)
			}
			if ok, err := s.StartRun(ctx, "proj_r", &running, "lease_a"); err != nil || !ok {
				t.Fatalf("the owner's start: %v, %v", ok, err)
			}
			if ok, err := s.StartRun(ctx, "proj_r", &running, "lease_a"); err != nil || ok {
				t.Fatalf("a second start: %v, %v; want refused (not queued)", ok, err)
			}
			if ok, err := s.FailRun(ctx, "proj_r", &failed, "lease_a", session.RunRunning, &failed); err != nil || !ok {
				t.Fatalf("the recovery's fail: %v, %v", ok, err)
			}
			if got, owner, err := s.GetRunOwner(ctx, "proj_r", "run_1"); err != nil || got.State != session.RunFailed || owner != "lease_a" {
				t.Fatalf("after the fail: %+v, %q, %v", got, owner, err)
			}
			succeeded := *run
			succeeded.State, succeeded.Stdout = session.RunSucceeded, "out"
			if ok, err := s.FinishRun(ctx, "proj_r", &succeeded, "lease_a", &succeeded, 0); err != nil || ok {
				t.Fatalf("the owner's end after the recovery's: %v, %v; want refused", ok, err)
			}
			if got, err := s.GetRun(ctx, "proj_r", "run_1"); err != nil || got.State != session.RunFailed || got.Stdout != "" {
				t.Fatalf("after the owner's late end: %+v, %v; want the recovery's, failed", got, err)
			}
			// run_2 is not recovered: its owner's end is written, with its event; another
			// attempt's is not.
			run2 := &session.Run{ID: "run_2", Object: "run", SessionID: &sess, State: session.RunRunning}
			if _, err := s.CreateRun(ctx, "proj_r", run2, "lease_c"); err != nil {
				t.Fatal(err)
			}
			done := *run2
			done.State, done.Stdout = session.RunSucceeded, "out"
			if ok, err := s.FinishRun(ctx, "proj_r", &done, "lease_d", &done, 0); err != nil || ok {
				t.Fatalf("another attempt's end: %v, %v; want refused", ok, err)
			}
			if ok, err := s.FinishRun(ctx, "proj_r", &done, "lease_c", &done, 0); err != nil || !ok {
				t.Fatalf("the owner's end: %v, %v", ok, err)
			}
			if ok, err := s.FinishRun(ctx, "proj_r", &done, "lease_c", &done, 0); err != nil || ok {
				t.Fatalf("a second end: %v, %v; want refused", ok, err)
			}
			if got, err := s.GetRun(ctx, "proj_r", "run_2"); err != nil || got.State != session.RunSucceeded || got.Stdout != "out" {
				t.Fatalf("after the owner's end: %+v, %v", got, err)
			}
			key := ProjectKeys("proj_r").run("run_2")
			if ttl, err := s.rdb.TTL(ctx, key).Result(); err != nil || ttl <= 0 {
				t.Fatalf("TTL of %s: %v, %v; want the retention", key, ttl, err)
			}
			evs, err := s.OutboxEvents(ctx, "proj_r")
			if err != nil {
				t.Fatal(err)
			}
			var ends []string
			for _, ev := range evs {
				var r session.Run
				if ev.Type != session.EventRunFinished || ev.SessionID != sess || json.Unmarshal(ev.Object, &r) != nil {
					t.Fatalf("event %+v, want a run.finished", ev)
				}
				ends = append(ends, r.ID+" "+r.State)
			}
			if strings.Join(ends, ",") != "run_1 failed,run_2 succeeded" {
				t.Fatalf("run.finished events %v, want run_1's recovery's and run_2's owner's, once each", ends)
			}
		})
	}
}

// TestRunWorkLeases: an attempt's lease is due once it ends, claimed by one recovery, after
// which the attempt's renewals fail, and released by the claim's token.
func TestRunWorkLeases(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			ref := RunRef{Project: "proj_r", ID: "run_1", Attempt: "lease_a"}
			now := time.Now()
			if err := s.SetRunWork(ctx, ref, now.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
			if due, next, err := s.DueRunWork(ctx, now, 10); err != nil || len(due) != 0 || next.IsZero() {
				t.Fatalf("before its end: due %v, next %v, %v", due, next, err)
			}
			if ok, err := s.ClaimRunWork(ctx, ref, "lease_r", now, now.Add(time.Minute)); err != nil || ok {
				t.Fatalf("a claim of a lease that runs: %v, %v", ok, err)
			}
			later := now.Add(2 * time.Second)
			due, _, err := s.DueRunWork(ctx, later, 10)
			if err != nil || len(due) != 1 || due[0] != ref {
				t.Fatalf("after its end: due %v, %v; want %v", due, err, ref)
			}
			if ok, err := s.ClaimRunWork(ctx, ref, "lease_r", later, later.Add(time.Minute)); err != nil || !ok {
				t.Fatalf("the recovery's claim: %v, %v", ok, err)
			}
			if ok, err := s.ClaimRunWork(ctx, ref, "lease_s", later, later.Add(time.Minute)); err != nil || ok {
				t.Fatalf("a second recovery's claim: %v, %v; want refused", ok, err)
			}
			if ok, err := s.RenewRunWork(ctx, ref, later.Add(time.Minute)); err != nil || ok {
				t.Fatalf("the attempt's renewal after the claim: %v, %v; want refused", ok, err)
			}
			if ok, err := s.ReleaseRunWork(ctx, ref, "lease_r"); err != nil || !ok {
				t.Fatalf("the recovery's release: %v, %v", ok, err)
			}
			if due, next, err := s.DueRunWork(ctx, later.Add(time.Hour), 10); err != nil || len(due) != 0 || !next.IsZero() {
				t.Fatalf("after the release: due %v, next %v, %v", due, next, err)
			}
		})
	}
}

// TestRunWorkLeaseShards: the runs' leases are spread over shard keys, each its own hash tag
// (over a Cluster's masters), not one key that every run of the fleet writes; the recovery's
// DueRunWork reads every shard, and the lease set of before the shards, which an older
// gateway still writes during a rolling deploy: its leases are answered, merged by their end,
// claimed and released there. A pass answers at most limit. Before, every lease was in
// "wb:{runs}:work".
func TestRunWorkLeaseShards(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.New(t)
			s := New(rdb)
			now := time.Now().Truncate(time.Millisecond)
			const runs = 32
			var refs []RunRef
			for i := range runs {
				ref := RunRef{Project: "proj_r", ID: fmt.Sprintf("run_%d", i), Attempt: fmt.Sprintf("lease_%d", i)}
				// Leases end a millisecond apart, from 2 s ago: all due, in this order.
				if err := s.SetRunWork(ctx, ref, now.Add(-2*time.Second+time.Duration(i)*time.Millisecond)); err != nil {
					t.Fatal(err)
				}
				refs = append(refs, ref)
			}
			if n, err := rdb.ZCard(ctx, "wb:{runs}:work").Result(); err != nil || n != 0 {
				t.Errorf("leases in the key of before the shards: %d (%v), want none", n, err)
			}
			shards, masters, total := 0, map[string]bool{}, int64(0)
			for i := range 16 {
				key := fmt.Sprintf("wb:{runs.%d}:work", i)
				n, err := rdb.ZCard(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				if h, err := rdb.HLen(ctx, fmt.Sprintf("wb:{runs.%d}:worker", i)).Result(); err != nil || h != n {
					t.Errorf("shard %d: %d leases, %d holders (%v); want as many", i, n, h, err)
				}
				if n > 0 {
					shards++
					if c, ok := rdb.(*redis.ClusterClient); ok {
						m, err := c.MasterForKey(ctx, key)
						if err != nil {
							t.Fatal(err)
						}
						masters[m.Options().Addr] = true
					}
				}
				total += n
			}
			if total != runs || shards < 8 {
				t.Fatalf("%d leases in %d shard keys, want %d in 8 or more", total, shards, runs)
			}
			if _, ok := rdb.(*redis.ClusterClient); ok && len(masters) < 2 {
				t.Errorf("the shards with leases are on %d Cluster masters, want several", len(masters))
			}

			// An older gateway's lease, as it writes it: due first (it ended earliest).
			old := RunRef{Project: "proj_r", ID: "run_old", Attempt: "lease_old"}
			if err := rdb.ZAdd(ctx, "wb:{runs}:work", redis.Z{Score: float64(now.Add(-time.Hour).UnixMilli()), Member: old.member()}).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.HSet(ctx, "wb:{runs}:worker", old.member(), old.Attempt).Err(); err != nil {
				t.Fatal(err)
			}
			due, next, err := s.DueRunWork(ctx, now, 5)
			if want := append([]RunRef{old}, refs[:4]...); err != nil || fmt.Sprint(due) != fmt.Sprint(want) || !next.Equal(now) {
				t.Fatalf("a pass of 5: due %v, next %v (%v); want %v, next now (more are due)", due, next, err, want)
			}
			due, next, err = s.DueRunWork(ctx, now, 100)
			if err != nil || len(due) != runs+1 || !next.IsZero() {
				t.Fatalf("a pass of 100: %d due, next %v (%v); want %d, none next", len(due), next, err, runs+1)
			}
			for _, ref := range []RunRef{old, refs[7], refs[30]} {
				if ok, err := s.ClaimRunWork(ctx, ref, "lease_r", now, now.Add(time.Minute)); err != nil || !ok {
					t.Fatalf("the recovery's claim of %v: %v, %v", ref, ok, err)
				}
				if ok, err := s.ClaimRunWork(ctx, ref, "lease_s", now, now.Add(time.Minute)); err != nil || ok {
					t.Fatalf("a second recovery's claim of %v: %v, %v; want refused", ref, ok, err)
				}
				if ok, err := s.ReleaseRunWork(ctx, ref, "lease_s"); err != nil || ok {
					t.Fatalf("a release of %v by a token that does not hold it: %v, %v; want refused", ref, ok, err)
				}
				if ok, err := s.ReleaseRunWork(ctx, ref, "lease_r"); err != nil || !ok {
					t.Fatalf("the recovery's release of %v: %v, %v", ref, ok, err)
				}
			}
			if n, err := rdb.ZCard(ctx, "wb:{runs}:work").Result(); err != nil || n != 0 {
				t.Errorf("the older gateway's lease after its release: %d left (%v)", n, err)
			}
			if due, _, err := s.DueRunWork(ctx, now.Add(time.Hour), 100); err != nil || len(due) != runs-2 {
				t.Errorf("after three releases: %d due (%v), want %d", len(due), err, runs-2)
			}
		})
	}
}

// TestLegacyRuns: runs saved before each had a key of its own (one hash per project, with an
// index, no TTL) are read and moved to keys of their own, with what is left of the retention
// from their last change: GetRun moves the one it reads, MigrateLegacyRuns all the others,
// once. One past the retention is dropped; one left queued or running (its gateway wrote
// that hash and is gone) moves failed, saying to run it again. Before, GET answered 404 for
// every one of them, and the hash stayed for ever.
func TestLegacyRuns(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.New(t)
			const retention = 7 * 24 * time.Hour
			s := New(rdb, WithRetention(retention))
			now := time.Now()
			at := func(ago time.Duration) *session.Time { return session.At(now.Add(-ago)) }
			legacy := map[string]*session.Run{
				"run_read":  {ID: "run_read", State: session.RunSucceeded, Stdout: "read", CreatedAt: *at(49 * time.Hour), FinishedAt: at(48 * time.Hour)},
				"run_moved": {ID: "run_moved", State: session.RunFailed, Stderr: "moved", CreatedAt: *at(25 * time.Hour), FinishedAt: at(24 * time.Hour)},
				"run_stale": {ID: "run_stale", State: session.RunSucceeded, CreatedAt: *at(9 * 24 * time.Hour), FinishedAt: at(8 * 24 * time.Hour)},
				"run_stuck": {ID: "run_stuck", State: session.RunRunning, CreatedAt: *at(30 * 24 * time.Hour), StartedAt: at(30 * 24 * time.Hour)},
			}
			for _, p := range []string{"proj_l1", "proj_l2"} {
				if err := rdb.SAdd(ctx, ProjectsKey, p).Err(); err != nil {
					t.Fatal(err)
				}
				for id, run := range legacy {
					run.Object = "run"
					if err := s.PutObject(ctx, p, legacyKindRun, id, run); err != nil { // as gateways wrote them before
						t.Fatal(err)
					}
				}
			}
			ttlOf := func(p, id string) time.Duration {
				ttl, err := rdb.TTL(ctx, ProjectKeys(p).run(id)).Result()
				if err != nil {
					t.Fatal(err)
				}
				return ttl
			}
			near := func(got, want time.Duration) bool { return got > want-time.Minute && got <= want }

			got, err := s.GetRun(ctx, "proj_l1", "run_read")
			if err != nil || got.Stdout != "read" || got.State != session.RunSucceeded {
				t.Fatalf("GetRun of a legacy run: %+v, %v", got, err)
			}
			if ttl := ttlOf("proj_l1", "run_read"); !near(ttl, retention-48*time.Hour) {
				t.Errorf("the run GetRun moved has TTL %v, want the rest of its retention (%v)", ttl, retention-48*time.Hour)
			}
			if _, err := s.GetRun(ctx, "proj_l1", "run_stale"); !errors.Is(err, ErrNotFound) {
				t.Errorf("GetRun of a legacy run past its retention: %v, want ErrNotFound", err)
			}

			n, err := s.MigrateLegacyRuns(ctx)
			if err != nil || n != 6 {
				t.Fatalf("MigrateLegacyRuns: %d, %v; want the 6 runs GetRun had not moved", n, err)
			}
			for _, p := range []string{"proj_l1", "proj_l2"} {
				k := ProjectKeys(p)
				if n, err := rdb.Exists(ctx, k.objects(legacyKindRun), k.objIndex(legacyKindRun)).Result(); err != nil || n != 0 {
					t.Errorf("%s: %d legacy keys left (%v), want none", p, n, err)
				}
				if got, err := s.GetRun(ctx, p, "run_moved"); err != nil || got.Stderr != "moved" {
					t.Errorf("%s: the moved run: %+v, %v", p, got, err)
				}
				if ttl := ttlOf(p, "run_moved"); !near(ttl, retention-24*time.Hour) {
					t.Errorf("%s: the moved run has TTL %v, want %v", p, ttl, retention-24*time.Hour)
				}
				got, err := s.GetRun(ctx, p, "run_stuck")
				if err != nil || got.State != session.RunFailed || got.Error == nil || *got.Error != session.RunOrphaned || got.FinishedAt == nil {
					t.Errorf("%s: the run left running: %+v, %v; want failed: %q", p, got, err, session.RunOrphaned)
				}
				if ttl := ttlOf(p, "run_stuck"); !near(ttl, retention) {
					t.Errorf("%s: the run left running has TTL %v, want the retention from its end now", p, ttl)
				}
				if _, err := s.GetRun(ctx, p, "run_stale"); !errors.Is(err, ErrNotFound) {
					t.Errorf("%s: the run past its retention: %v, want ErrNotFound", p, err)
				}
			}
			// Done once: a later legacy write (a gateway from before, still running) is moved
			// by the GetRun that reads it, not by a second pass.
			if err := s.PutObject(ctx, "proj_l1", legacyKindRun, "run_late", legacy["run_read"]); err != nil {
				t.Fatal(err)
			}
			if n, err := s.MigrateLegacyRuns(ctx); err != nil || n != 0 {
				t.Errorf("a second MigrateLegacyRuns: %d, %v; want nothing done", n, err)
			}
			if got, err := s.GetRun(ctx, "proj_l1", "run_late"); err != nil || got.Stdout != "read" {
				t.Errorf("a legacy run written after the pass: %+v, %v", got, err)
			}
		})
	}
}

// TestOutputBudget: stored output (runs' and answers kept for replays) past a project's
// budget drops the oldest first, whatever its kind: a run keeps its record, marked
// output_expired, with the byte counts of what it wrote; an answer is rewritten to the one
// given for that, with its TTL. Output that expired leaves the count; a small output never
// enters it; an output over the budget alone is dropped at once. No write fails for it. On
// every backend.
func TestOutputBudget(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.New(t)
			now := time.Now()
			s := New(rdb, WithClock(func() time.Time { return now }))
			const p, budget = "proj_b", 40 << 10
			k := ProjectKeys(p)
			total := func() int {
				n, err := rdb.HGet(ctx, k.keptSizes(), "total").Int()
				if err != nil && !errors.Is(err, redis.Nil) {
					t.Fatal(err)
				}
				return n
			}
			finish := func(id string, out int) {
				t.Helper()
				run := &session.Run{ID: id, Object: "run", State: session.RunSucceeded, Stdout: strings.Repeat("x", out), StdoutBytes: int64(out)}
				if _, err := s.FinishRun(ctx, p, run, "lease_"+id, nil, budget); err != nil {
					t.Fatal(err)
				}
				now = now.Add(time.Second)
			}
			answer := func(key string, body int) {
				t.Helper()
				_, c, err := s.IdemBegin(ctx, p, key, "fp")
				if err != nil {
					t.Fatal(err)
				}
				dropped := &IdemRecord{Status: 409, Body: []byte("dropped")}
				if err := s.IdemFinish(ctx, p, key, c, IdemRecord{Fingerprint: "fp", Status: 201, Body: []byte(strings.Repeat("y", body))}, dropped, budget); err != nil {
					t.Fatal(err)
				}
				now = now.Add(time.Second)
			}
			kept := func(id string) bool {
				t.Helper()
				run, err := s.GetRun(ctx, p, id)
				if err != nil {
					t.Fatal(err)
				}
				if run.OutputExpired {
					if run.Stdout != "" || !run.Truncated || run.StdoutBytes == 0 || run.State != session.RunSucceeded {
						t.Errorf("run %s without its output: %+v, want succeeded, empty, truncated, its byte count", id, run)
					}
					if ttl, err := rdb.TTL(ctx, k.run(id)).Result(); err != nil || ttl <= 0 {
						t.Errorf("run %s without its output has TTL %v (%v), want its own", id, ttl, err)
					}
				}
				return !run.OutputExpired && len(run.Stdout) == int(run.StdoutBytes)
			}
			replayed := func(key string) bool {
				t.Helper()
				rec, _, err := s.IdemBegin(ctx, p, key, "fp")
				if err != nil || rec == nil {
					t.Fatalf("replay of %s: %+v, %v", key, rec, err)
				}
				return rec.Status == 201
			}

			for _, id := range []string{"run_1", "run_2", "run_3", "run_4"} {
				finish(id, 8<<10)
			}
			finish("run_small", 100)
			if !kept("run_1") || !kept("run_4") || !kept("run_small") || total() > budget {
				t.Fatalf("within the budget (total %d): an output was dropped", total())
			}
			before := total()
			answer("key_1", 12<<10) // past the budget: run_1 and run_2 go
			if kept("run_1") || kept("run_2") || !kept("run_3") || !kept("run_4") || !kept("run_small") || !replayed("key_1") {
				t.Errorf("past the budget: run_1 %v, run_2 %v, run_3 %v, run_4 %v, small %v, key_1 %v; want the two oldest outputs dropped",
					kept("run_1"), kept("run_2"), kept("run_3"), kept("run_4"), kept("run_small"), replayed("key_1"))
			}
			if n := total(); n > budget || n <= before-(20<<10) {
				t.Errorf("total %d after the drop, want within %d", n, budget)
			}
			answer("key_2", 12<<10) // run_3 and run_4 are older than key_1
			if kept("run_3") || kept("run_4") || !replayed("key_1") || !replayed("key_2") {
				t.Errorf("run_3 %v, run_4 %v, key_1 %v, key_2 %v; want the runs dropped, the answers kept", kept("run_3"), kept("run_4"), replayed("key_1"), replayed("key_2"))
			}
			answer("key_3", 12<<10)
			if replayed("key_1") || !replayed("key_3") {
				t.Errorf("key_1 %v, key_3 %v; want the oldest answer dropped", replayed("key_1"), replayed("key_3"))
			}
			if rec, _, err := s.IdemBegin(ctx, p, "key_1", "fp"); err != nil || rec == nil || rec.Status != 409 || string(rec.Body) != "dropped" {
				t.Errorf("the dropped answer replays %+v, %v; want the one given for that", rec, err)
			}
			if ttl, err := rdb.TTL(ctx, k.idempotency("key_1")).Result(); err != nil || ttl <= 0 || ttl > IdempotencyTTL {
				t.Errorf("the dropped answer has TTL %v (%v), want its own", ttl, err)
			}

			now = now.Add(IdempotencyTTL + time.Hour) // the answers expire (as far as the count knows)
			finish("run_5", 8<<10)
			if n := total(); n > 10<<10 {
				t.Errorf("total %d after the answers expired, want run_5's alone", n)
			}
			finish("run_huge", 50<<10)
			if kept("run_huge") || !kept("run_5") {
				t.Errorf("an output over the budget alone: kept %v (run_5 kept %v); want it dropped at once, run_5 kept", kept("run_huge"), kept("run_5"))
			}
			if n := total(); n > budget {
				t.Errorf("total %d, over the budget", n)
			}
		})
	}
}

// TestOutputBudgetForgetsExpiredFirst: outputs that expired are forgotten before any live one
// is dropped, however many there are. Before, a write forgot 64 of them and counted the rest:
// past a backlog of expired answers (a day's, among runs kept seven), it dropped live runs'
// output for room that was free already. On every backend.
func TestOutputBudgetForgetsExpiredFirst(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.New(t)
			now := time.Now()
			s := New(rdb, WithClock(func() time.Time { return now }))
			const p, roomy, tight = "proj_x", 1 << 30, 24 << 10
			finish := func(id string, budget int64) {
				t.Helper()
				run := &session.Run{ID: id, Object: "run", State: session.RunSucceeded, Stdout: strings.Repeat("x", 8<<10), StdoutBytes: 8 << 10}
				if _, err := s.FinishRun(ctx, p, run, "lease_"+id, nil, budget); err != nil {
					t.Fatal(err)
				}
				now = now.Add(time.Millisecond)
			}
			finish("run_live", roomy)
			for i := range 100 { // a backlog of answers, all expired a day later
				key := fmt.Sprintf("key_%d", i)
				_, c, err := s.IdemBegin(ctx, p, key, "fp")
				if err != nil {
					t.Fatal(err)
				}
				if err := s.IdemFinish(ctx, p, key, c, IdemRecord{Fingerprint: "fp", Status: 201, Body: []byte(strings.Repeat("y", 4<<10))},
					&IdemRecord{Status: 409}, roomy); err != nil {
					t.Fatal(err)
				}
				now = now.Add(time.Millisecond)
			}
			now = now.Add(IdempotencyTTL + time.Hour)
			finish("run_new", tight) // the two runs (16 KiB) fit within 24 KiB
			for _, id := range []string{"run_live", "run_new"} {
				if run, err := s.GetRun(ctx, p, id); err != nil || run.OutputExpired || run.Stdout == "" {
					t.Errorf("run %s after the answers expired: %+v, %v; want its output kept", id, run, err)
				}
			}
			if n, err := rdb.HGet(ctx, ProjectKeys(p).keptSizes(), "total").Int(); err != nil || n > tight {
				t.Errorf("total %d (%v), want the two runs' alone", n, err)
			}
		})
	}
}

// TestOutputBudgetSparesAReusedKey: an answer that expired, though a gateway's clock does
// not see it yet, and whose Idempotency-Key is used again, is not dropped over the new
// record (rewritten to the old answer's stub, it answered the new request's retry a replay of
// another body's dropped answer): the new record forgets the old count, and, for one made by
// a gateway of before that does not, the drop sees that the key holds another record now. On
// every backend.
func TestOutputBudgetSparesAReusedKey(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		for _, before := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/made by a gateway of before %v", b.Name, before), func(t *testing.T) {
				ctx := context.Background()
				rdb := b.New(t)
				now := time.Now()
				s := New(rdb, WithClock(func() time.Time { return now }))
				const p, budget = "proj_y", 40 << 10
				k := ProjectKeys(p)
				_, c, err := s.IdemBegin(ctx, p, "key_r", "fp_old")
				if err != nil {
					t.Fatal(err)
				}
				if err := s.IdemFinish(ctx, p, "key_r", c, IdemRecord{Fingerprint: "fp_old", Status: 201, Body: []byte(strings.Repeat("y", 12<<10))},
					&IdemRecord{Status: 409, Body: []byte("dropped")}, budget); err != nil {
					t.Fatal(err)
				}
				// Redis expires the answer (as DEL drops it: miniredis expires nothing by the
				// clock); the clocks of the gateways that write next lag it.
				if err := rdb.Del(ctx, k.idempotency("key_r")).Err(); err != nil {
					t.Fatal(err)
				}
				ref := "ref_new"
				if before { // its record, as its IdemBegin wrote it, without a word to the budget
					b, _ := json.Marshal(IdemRecord{Fingerprint: "fp_new", Ref: ref})
					if err := rdb.Set(ctx, k.idempotency("key_r"), b, IdempotencyTTL).Err(); err != nil {
						t.Fatal(err)
					}
				} else {
					_, reused, err := s.IdemBegin(ctx, p, "key_r", "fp_new")
					if err != nil || reused == nil || reused.Resumed {
						t.Fatalf("the key used again: %+v, %v; want a new claim", reused, err)
					}
					ref = reused.Ref
				}
				for i := range 4 { // past the budget: the oldest output counted goes first
					now = now.Add(time.Second)
					run := &session.Run{ID: fmt.Sprintf("run_%d", i), Object: "run", State: session.RunSucceeded, Stdout: strings.Repeat("x", 12<<10), StdoutBytes: 12 << 10}
					if _, err := s.FinishRun(ctx, p, run, "lease", nil, budget); err != nil {
						t.Fatal(err)
					}
				}
				raw, err := rdb.Get(ctx, k.idempotency("key_r")).Bytes()
				var rec IdemRecord
				if err != nil || json.Unmarshal(raw, &rec) != nil || rec.Fingerprint != "fp_new" || rec.Ref != ref || rec.Done {
					t.Fatalf("the key's new record after the budget's drops: %s (%v); want the new request's, under way", raw, err)
				}
				if n, err := rdb.HGet(ctx, k.keptSizes(), "total").Int(); err != nil || n > budget {
					t.Errorf("total %d (%v), over the budget", n, err)
				}
			})
		}
	}
}

// TestOutputBudgetForgetsAnOrphan: an output whose size is missing from the budget's hash
// (evicted, or deleted by hand) is forgotten from every set; before, the drop loop found it
// again on every pass once the project was over its budget, and the script ran for ever,
// Redis answering BUSY to every client.
func TestOutputBudgetForgetsAnOrphan(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.New(t)
			s := New(rdb)
			const p = "proj_x"
			finish := func(id string, budget int64) error {
				run := &session.Run{ID: id, Object: "run", State: session.RunSucceeded, Stdout: strings.Repeat("x", 8<<10), StdoutBytes: 8 << 10}
				c, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				_, err := s.FinishRun(c, p, run, "lease_"+id, nil, budget)
				return err
			}
			if err := finish("run_a", 1<<30); err != nil {
				t.Fatal(err)
			}
			k := ProjectKeys(p)
			for _, key := range []string{k.kept(), k.keptExpiry()} {
				if err := rdb.ZAdd(ctx, key, redis.Z{Score: 0, Member: "wb:{proj_x}:orphan"}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := finish("run_b", 12<<10); err != nil {
				t.Fatalf("a write over the budget with an orphan in its sets: %v", err)
			}
			if err := rdb.Ping(ctx).Err(); err != nil {
				t.Fatalf("Redis after the write: %v", err)
			}
			for _, key := range []string{k.kept(), k.keptExpiry()} {
				if _, err := rdb.ZScore(ctx, key, "wb:{proj_x}:orphan").Result(); !errors.Is(err, redis.Nil) {
					t.Errorf("the orphan is still in %s (%v)", key, err)
				}
			}
		})
	}
}

// moveAfterFirstGet is a go-redis hook that, right after the first GET of key, runs move:
// a migration that lands between GetRun's read of the run's own key and its read of the
// legacy hash.
type moveAfterFirstGet struct {
	key  string
	once *sync.Once
	move func()
}

func (h moveAfterFirstGet) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h moveAfterFirstGet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h moveAfterFirstGet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); len(args) == 2 && strings.EqualFold(fmt.Sprint(args[0]), "get") && args[1] == h.key {
			h.once.Do(h.move)
		}
		return err
	}
}

// TestLegacyRunReadDuringItsMove: a run saved before runs had keys of their own is read while
// the migration moves it (a gateway's start): its own key is read first, still absent, then the
// move lands, then the legacy hash is read, already empty. GetRun finds the run where it went;
// before, it answered not found (a cold make test's TestLegacyRunReadable: "GET
// /v1/runs/run_legacy1: status 404").
func TestLegacyRunReadDuringItsMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Server(t)
	s := New(rdb)
	const p, id = "proj_legacymove", "run_legacymove"
	run := session.Run{ID: id, Object: "run", State: session.RunSucceeded, Stdout: "old\n", CreatedAt: *session.At(time.Now())}
	if err := s.PutObject(ctx, p, legacyKindRun, id, run); err != nil {
		t.Fatal(err)
	}
	if err := rdb.SAdd(ctx, ProjectsKey, p).Err(); err != nil {
		t.Fatal(err)
	}
	other := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr})
	t.Cleanup(func() { _ = other.Close() })
	mover := New(other)
	rdb.AddHook(moveAfterFirstGet{key: ProjectKeys(p).run(id), once: &sync.Once{}, move: func() {
		if n, err := mover.MigrateLegacyRuns(ctx); err != nil || n != 1 {
			t.Errorf("the migration beside the read: %d, %v; want the run moved", n, err)
		}
	}})
	got, err := s.GetRun(ctx, p, id)
	if err != nil || got.Stdout != "old\n" {
		t.Fatalf("a legacy run read while the migration moved it: %+v, %v; want it, where it went", got, err)
	}
}
