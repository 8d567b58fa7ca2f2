package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
)

// TestSnapshotWorkLeases: a snapshot's lease is renewed and released only by its snapshot; a
// claim takes over only a lease that ran out, answers the snapshot that held it and leaves
// it the holder; a newer snapshot's lease supersedes an older one's left behind; and a lease
// ensured for a session that had none does not move one already recorded.
func TestSnapshotWorkLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	t0 := time.UnixMilli(1_800_000_000_000)
	ref := SessionRef{Project: "proj_s", ID: "sess_s"}
	must := func(ok bool, err error) bool {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	claim := func(now time.Time) (string, bool) {
		t.Helper()
		holder, ok, err := s.ClaimSnapshotWork(ctx, ref, now, now.Add(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return holder, ok
	}
	if err := s.SetSnapshotWork(ctx, ref, "snap_a", t0.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, ok := claim(t0.Add(10 * time.Second)); ok {
		t.Fatal("claimed a lease that still runs")
	}
	if must(s.RenewSnapshotWork(ctx, ref, "snap_b", t0.Add(time.Hour))) || must(s.ReleaseSnapshotWork(ctx, ref, "snap_b")) {
		t.Fatal("another snapshot renewed or released the lease")
	}
	if !must(s.RenewSnapshotWork(ctx, ref, "snap_a", t0.Add(60*time.Second))) {
		t.Fatal("the holder could not renew")
	}
	if due, next, _ := s.DueSnapshotWork(ctx, t0.Add(59*time.Second), 10); len(due) != 0 || !next.Equal(t0.Add(60*time.Second)) {
		t.Fatalf("before the renewed end: due %v next %v", due, next)
	}
	if due, _, _ := s.DueSnapshotWork(ctx, t0.Add(61*time.Second), 10); len(due) != 1 || due[0] != ref {
		t.Fatalf("after the end: due %v", due)
	}
	holder, ok := claim(t0.Add(61 * time.Second))
	if !ok || holder != "snap_a" {
		t.Fatalf("claim after the end: %q, %v; want snap_a, true", holder, ok)
	}
	if _, ok := claim(t0.Add(61 * time.Second)); ok {
		t.Fatal("a second claimant took the lease too")
	}
	if due, _, _ := s.DueSnapshotWork(ctx, t0.Add(61*time.Second), 10); len(due) != 0 {
		t.Fatalf("a claimed lease is still due: %v", due)
	}
	// The claimant ends it as the holder would.
	if !must(s.ReleaseSnapshotWork(ctx, ref, "snap_a")) {
		t.Fatal("the claimant could not release the lease with the snapshot it answered")
	}

	// A lease left behind (its gateway died after the session ran again) is superseded by
	// the next snapshot's, and the old one's release leaves the new one alone.
	if err := s.SetSnapshotWork(ctx, ref, "snap_c", t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSnapshotWork(ctx, ref, "snap_d", t0.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if must(s.ReleaseSnapshotWork(ctx, ref, "snap_c")) {
		t.Fatal("the older snapshot released the newer one's lease")
	}
	if err := s.EnsureSnapshotWork(ctx, ref, t0); err != nil {
		t.Fatal(err)
	}
	if due, next, _ := s.DueSnapshotWork(ctx, t0.Add(time.Minute), 10); len(due) != 0 || !next.Equal(t0.Add(3*time.Minute)) {
		t.Fatalf("ensure moved a recorded lease: due %v next %v", due, next)
	}
	if !must(s.ReleaseSnapshotWork(ctx, ref, "snap_d")) {
		t.Fatal("the holder could not release")
	}

	// A snapshot whose gateway could not take its lease takes the one the sweep gave the
	// session when it renews.
	if err := s.EnsureSnapshotWork(ctx, ref, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if !must(s.RenewSnapshotWork(ctx, ref, "snap_e", t0.Add(5*time.Minute))) {
		t.Fatal("the snapshot under way could not take a lease with no holder")
	}
	if holder, ok := claim(t0.Add(6 * time.Minute)); !ok || holder != "snap_e" {
		t.Fatalf("claim of the lease taken over: %q, %v; want snap_e, true", holder, ok)
	}
	if !must(s.ReleaseSnapshotWork(ctx, ref, "snap_e")) {
		t.Fatal("could not release the lease taken over")
	}

	// A session in snapshotting with no lease at all gets one; its holder is unknown, and the
	// claimant can still release it.
	if err := s.EnsureSnapshotWork(ctx, ref, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	holder, ok = claim(t0.Add(2 * time.Minute))
	if !ok || holder != "" {
		t.Fatalf("claim of an ensured lease: %q, %v; want \"\", true", holder, ok)
	}
	// Its snapshot, still under way (its gateway's SetSnapshotWork had failed), can take it
	// as it renews, as before the claim.
	if !must(s.RenewSnapshotWork(ctx, ref, "snap_e2", t0.Add(3*time.Minute))) {
		t.Fatal("a claim of a lease with no holder made one: the snapshot under way could not renew it")
	}
	if !must(s.ReleaseSnapshotWork(ctx, ref, "snap_e2")) {
		t.Fatal("could not release the lease taken after the claim")
	}
	if err := s.EnsureSnapshotWork(ctx, ref, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if holder, ok = claim(t0.Add(2 * time.Minute)); !ok || holder != "" {
		t.Fatalf("claim of an ensured lease: %q, %v; want \"\", true", holder, ok)
	}
	if !must(s.ReleaseSnapshotWork(ctx, ref, holder)) {
		t.Fatal("could not release an ensured lease once claimed")
	}

	if due, next, _ := s.DueSnapshotWork(ctx, t0.Add(time.Hour), 10); len(due) != 0 || !next.IsZero() {
		t.Fatalf("leases left: due %v next %v", due, next)
	}
}

// TestEnsureAfterTheSnapshotEnded: the placer's sweep read the snapshot a session takes, and
// the session left it before the sweep set its lease: no lease is left in that snapshot's
// name, whose recovery would record it failed (a snapshot its gateway recorded and the user
// since deleted would show again).
func TestEnsureAfterTheSnapshotEnded(t *testing.T) {
	rdb := redistest.Server(t)
	s := New(rdb)
	ctx := context.Background()
	const p = "proj_ensureended"
	sess := mustCreate(t, s, newPending(p, ""), 5)
	c := func(from, to session.State, d session.Driver) Change {
		return Change{Project: p, ID: sess.ID, From: from, To: to, Driver: d, Snapshot: "snap_x"}
	}
	step(t, s, c(session.Pending, session.Provisioning, session.Placer))
	step(t, s, c(session.Provisioning, session.Running, session.Node))
	step(t, s, c(session.Running, session.Snapshotting, session.Caller))
	redistest.BeforeOnce(rdb, func(cmd redis.Cmder) bool { return slices.Contains(cmd.Args(), any("ensure")) }, func() error {
		_, err := s.Transition(ctx, c(session.Snapshotting, session.Running, session.Caller))
		return err
	})
	ref := SessionRef{Project: p, ID: sess.ID}
	if err := s.EnsureSnapshotWork(ctx, ref, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if due, next, err := s.DueSnapshotWork(ctx, time.Now().Add(time.Hour), 10); err != nil || len(due) != 0 || !next.IsZero() {
		t.Fatalf("leases after the sweep of a snapshot that ended meanwhile: %v %v %v, want none", due, next, err)
	}
}

// TestDesktopAndSnapshotLeaseShards: the next release's binary (writing in the shards,
// withLeasesInShards) spreads the desktops' and the snapshots' leases over shard keys, each
// its own hash tag (over a Cluster's masters), as the runs' are, not in one key that every
// transition (snapshot) of the fleet writes; this release's writes them in the lease set of
// before the shards, as the older binaries do. Both read both: the Due reads every shard and
// the old key, and a lease the other release wrote (its gateway died during a rolling deploy)
// that lapsed is answered first, and a claim moves it to this binary's keys (there it is
// renewed and released), leaving in the other no end and the claimant as holder, so that
// the other holder's renewal fails; a lease there keeps an ensure from setting one beside it
// (its work runs), and a newer work's set supersedes it. Before, every lease was in
// "wb:{desktops}:work" or "wb:{snapshots}:work", read by no shard's binary.
func TestDesktopAndSnapshotLeaseShards(t *testing.T) {
	t.Parallel()
	type family struct {
		name    string    // the shards' name
		legacy  leaseKeys // the lease set of before the shards
		ids     string    // id prefix
		member  func(id string) string
		set     func(s *Store, id, token string, until time.Time) error
		renew   func(s *Store, id, token string, until time.Time) (bool, error)
		release func(s *Store, id, token string) (bool, error)
		ensure  func(s *Store, id string, until time.Time) (bool, error)
		// claim claims with token where the family chooses its holder (desktops), and
		// answers the holder it claimed for.
		claim func(s *Store, id, token string, now, until time.Time) (string, bool, error)
		due   func(s *Store, now time.Time, limit int) ([]string, time.Time, error)
	}
	const project = "proj_l"
	desktops := family{
		name: "desktops", legacy: leaseKeys{ends: "wb:{desktops}:work", holders: "wb:{desktops}:worker"}, ids: "desk_",
		member: func(id string) string { return DesktopRef{project, id}.member() },
		set: func(s *Store, id, token string, until time.Time) error {
			return s.SetDesktopWork(context.Background(), DesktopRef{project, id}, token, until)
		},
		renew: func(s *Store, id, token string, until time.Time) (bool, error) {
			return s.RenewDesktopWork(context.Background(), DesktopRef{project, id}, token, until)
		},
		release: func(s *Store, id, token string) (bool, error) {
			return s.ReleaseDesktopWork(context.Background(), DesktopRef{project, id}, token)
		},
		ensure: func(s *Store, id string, until time.Time) (bool, error) {
			return s.EnsureDesktopWork(context.Background(), DesktopRef{project, id}, until)
		},
		claim: func(s *Store, id, token string, now, until time.Time) (string, bool, error) {
			ok, err := s.ClaimDesktopWork(context.Background(), DesktopRef{project, id}, token, now, until)
			return token, ok, err
		},
		due: func(s *Store, now time.Time, limit int) ([]string, time.Time, error) {
			refs, next, err := s.DueDesktopWork(context.Background(), now, limit)
			var ids []string
			for _, r := range refs {
				ids = append(ids, r.ID)
			}
			return ids, next, err
		},
	}
	snapshots := family{
		name: "snapshots", legacy: leaseKeys{ends: "wb:{snapshots}:work", holders: "wb:{snapshots}:worker"}, ids: "sess_",
		member: func(id string) string { return SessionRef{project, id}.member() },
		set: func(s *Store, id, token string, until time.Time) error {
			return s.SetSnapshotWork(context.Background(), SessionRef{project, id}, token, until)
		},
		renew: func(s *Store, id, token string, until time.Time) (bool, error) {
			return s.RenewSnapshotWork(context.Background(), SessionRef{project, id}, token, until)
		},
		release: func(s *Store, id, token string) (bool, error) {
			return s.ReleaseSnapshotWork(context.Background(), SessionRef{project, id}, token)
		},
		ensure: func(s *Store, id string, until time.Time) (bool, error) {
			ctx := context.Background()
			ref := SessionRef{project, id}
			if err := s.rdb.HSet(ctx, ProjectKeys(project).session(id), "snap", "snap_ensured").Err(); err != nil {
				return false, err
			}
			own, _ := s.snapshotLeases.keys(id)
			before, err := s.rdb.ZCard(ctx, own.ends).Result()
			if err != nil {
				return false, err
			}
			if err := s.EnsureSnapshotWork(ctx, ref, until); err != nil {
				return false, err
			}
			after, err := s.rdb.ZCard(ctx, own.ends).Result()
			return after > before, err
		},
		claim: func(s *Store, id, _ string, now, until time.Time) (string, bool, error) {
			return s.ClaimSnapshotWork(context.Background(), SessionRef{project, id}, now, until)
		},
		due: func(s *Store, now time.Time, limit int) ([]string, time.Time, error) {
			refs, next, err := s.DueSnapshotWork(context.Background(), now, limit)
			var ids []string
			for _, r := range refs {
				ids = append(ids, r.ID)
			}
			return ids, next, err
		},
	}
	for _, b := range redistest.Backends() {
		for _, f := range []family{desktops, snapshots} {
			for _, inShards := range []bool{true, false} {
				release := map[bool]string{true: "next", false: "this"}[inShards]
				t.Run(b.Name+"/"+f.name+"/"+release, func(t *testing.T) {
					ctx := context.Background()
					rdb := b.New(t)
					s := New(rdb)
					if inShards {
						s = New(rdb, withLeasesInShards())
					}
					// other names the keys in which the other release writes the lease on id.
					other := func(id string) leaseKeys {
						if inShards {
							return f.legacy
						}
						ends, holders := workShardKeys(f.name, workShardOf(id))
						return leaseKeys{ends: ends, holders: holders}
					}
					// otherEnds counts the leases that end in the other release's keys.
					otherEnds := func() int64 {
						t.Helper()
						keys := []string{f.legacy.ends}
						if !inShards {
							keys = nil
							for i := range 16 {
								keys = append(keys, fmt.Sprintf("wb:{%s.%d}:work", f.name, i))
							}
						}
						var c int64
						for _, k := range keys {
							n, err := rdb.ZCard(ctx, k).Result()
							if err != nil {
								t.Fatal(err)
							}
							c += n
						}
						return c
					}
					now := time.Now().Truncate(time.Millisecond)
					must := func(ok bool, err error) bool {
						t.Helper()
						if err != nil {
							t.Fatal(err)
						}
						return ok
					}
					const n = 32
					var ids []string
					for i := range n {
						id := fmt.Sprintf("%s%d", f.ids, i)
						// Leases end a millisecond apart, from 2 s ago: all due, in this order.
						if err := f.set(s, id, "tok_"+id, now.Add(-2*time.Second+time.Duration(i)*time.Millisecond)); err != nil {
							t.Fatal(err)
						}
						ids = append(ids, id)
					}
					if !inShards {
						if c, err := rdb.ZCard(ctx, f.legacy.ends).Result(); err != nil || c != n || otherEnds() != 0 {
							t.Fatalf("this release's leases: %d in the key of before the shards (%v), %d in the shards; want %d there, none in the shards", c, err, otherEnds(), n)
						}
					} else if c, err := rdb.ZCard(ctx, f.legacy.ends).Result(); err != nil || c != 0 {
						t.Errorf("leases in the key of before the shards: %d (%v), want none", c, err)
					}
					shards, masters, total := 0, map[string]bool{}, int64(0)
					for i := range 16 {
						key := fmt.Sprintf("wb:{%s.%d}:work", f.name, i)
						c, err := rdb.ZCard(ctx, key).Result()
						if err != nil {
							t.Fatal(err)
						}
						if h, err := rdb.HLen(ctx, fmt.Sprintf("wb:{%s.%d}:worker", f.name, i)).Result(); err != nil || h != c {
							t.Errorf("shard %d: %d leases, %d holders (%v); want as many", i, c, h, err)
						}
						if c > 0 {
							shards++
							if cc, ok := rdb.(*redis.ClusterClient); ok {
								m, err := cc.MasterForKey(ctx, key)
								if err != nil {
									t.Fatal(err)
								}
								masters[m.Options().Addr] = true
							}
						}
						total += c
					}
					if inShards && (total != n || shards < 8) {
						t.Fatalf("%d leases in %d shard keys, want %d in 8 or more", total, shards, n)
					}
					if _, ok := rdb.(*redis.ClusterClient); ok && inShards && len(masters) < 2 {
						t.Errorf("the shards with leases are on %d Cluster masters, want several", len(masters))
					}

					// The other release's lease (an older gateway's, or the next release's), as it
					// writes it, that ran out first.
					old := f.ids + "old"
					oldLease := func(id, holder string, ends time.Time) {
						t.Helper()
						if err := rdb.ZAdd(ctx, other(id).ends, redis.Z{Score: float64(ends.UnixMilli()), Member: f.member(id)}).Err(); err != nil {
							t.Fatal(err)
						}
						if err := rdb.HSet(ctx, other(id).holders, f.member(id), holder).Err(); err != nil {
							t.Fatal(err)
						}
					}
					oldLease(old, "old_tok", now.Add(-time.Hour))
					due, next, err := f.due(s, now, 5)
					if want := append([]string{old}, ids[:4]...); err != nil || !slices.Equal(due, want) || !next.Equal(now) {
						t.Fatalf("a pass of 5: due %v, next %v (%v); want %v, next now (more are due)", due, next, err, want)
					}
					if due, next, err := f.due(s, now, 100); err != nil || len(due) != n+1 || !next.IsZero() {
						t.Fatalf("a pass of 100: %d due, next %v (%v); want %d, none next", len(due), next, err, n+1)
					}
					// Its lease keeps an ensure from setting another in the shard.
					if must(f.ensure(s, old, now)) {
						t.Error("an ensure set a lease in the shard beside an older gateway's")
					}
					holder, ok, err := f.claim(s, old, "tok_r", now, now.Add(time.Minute))
					if err != nil || !ok {
						t.Fatalf("the recovery's claim of the older gateway's lease: %v, %v", ok, err)
					}
					if _, again, err := f.claim(s, old, "tok_s", now, now.Add(time.Minute)); err != nil || again {
						t.Fatalf("a second recovery's claim: %v, %v; want refused", again, err)
					}
					if _, err := rdb.ZScore(ctx, other(old).ends, f.member(old)).Result(); !errors.Is(err, redis.Nil) {
						t.Errorf("the claimed lease still ends in the other release's keys (%v)", err)
					}
					if f.name == "desktops" && must(s.lease(ctx, other(old), "keep", f.member(old), old, "old_tok", now.Add(time.Hour), now)) {
						t.Error("the older gateway renewed the lease a recovery claimed")
					}
					if due, _, err := f.due(s, now.Add(59*time.Second), 100); err != nil || slices.Contains(due, old) {
						t.Errorf("the claimed lease is due before its claim ends: %v (%v)", due, err)
					}
					if !must(f.renew(s, old, holder, now.Add(2*time.Minute))) {
						t.Error("the recovery could not renew the lease it claimed")
					}
					if !must(f.release(s, old, holder)) {
						t.Error("the recovery could not release the lease it claimed")
					}
					if due, _, err := f.due(s, now.Add(time.Hour), 100); err != nil || len(due) != n {
						t.Errorf("after the release: %d due (%v), want %d", len(due), err, n)
					}

					// A newer work's set supersedes an older gateway's lease that still runs.
					busy := f.ids + "busy"
					oldLease(busy, "busy_tok", now.Add(time.Minute))
					if err := f.set(s, busy, "tok_new", now.Add(time.Minute)); err != nil {
						t.Fatal(err)
					}
					if must(s.lease(ctx, other(busy), "keep", f.member(busy), busy, "busy_tok", now.Add(time.Hour), now)) {
						t.Error("the other release's gateway renewed the lease a newer work superseded")
					}
					if c := otherEnds(); c != 0 {
						t.Errorf("leases that end in the other release's keys: %d, want none", c)
					}
					if due, _, err := f.due(s, now.Add(2*time.Minute), 100); err != nil || len(due) != n+1 || !slices.Contains(due, busy) {
						t.Errorf("after the newer work's lease ended: %d due (%v), want %d, with %s once", len(due), err, n+1, busy)
					}
				})
			}
		}
	}
}

// withLeasesInShards makes a store of the next release's binary, which writes the desktops'
// and the snapshots' leases in their shards (writeDesktopAndSnapshotLeasesInShards).
func withLeasesInShards() Option {
	return func(s *Store) {
		s.desktopLeases, s.snapshotLeases = desktopLeaseSet(true), snapshotLeaseSet(true)
	}
}

// workShardOf is the shard of id: FNV-1a, modulo 16 (as TestKeyNames pins it).
func workShardOf(id string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % 16)
}

// TestOlderBinarySeesThisReleasesLeases: during the rolling deploy of this release, gateways
// and placers from before the shards read and write only the lease sets of before the
// shards, so this release writes its desktops' and snapshots' leases there. An older
// binary's leaseOrphan (EnsureDesktopWork) or sweep (EnsureSnapshotWork) beside a transition
// (snapshot) of this release that runs finds its lease and sets none, its recovery has none
// to claim, and its set (a newer request) supersedes it: the work's renewal fails. Had this
// release written only in the shards, the older gateway would have resumed work this one was
// doing (two works on one desktop) and its set would not have stopped it.
func TestOlderBinarySeesThisReleasesLeases(t *testing.T) {
	t.Parallel()
	type family struct {
		name   string
		legacy leaseKeys // the lease set of before the shards, all an older binary reads
		member string
		id     string
		set    func(s *Store, token string, until time.Time) error
		renew  func(s *Store, token string, until time.Time) (bool, error)
	}
	dref := DesktopRef{Project: "proj_o", ID: "desk_o"}
	sref := SessionRef{Project: "proj_o", ID: "sess_o"}
	families := []family{
		{"desktops", leaseKeys{"wb:{desktops}:work", "wb:{desktops}:worker", "desktop"}, dref.member(), dref.ID,
			func(s *Store, tok string, until time.Time) error {
				return s.SetDesktopWork(context.Background(), dref, tok, until)
			},
			func(s *Store, tok string, until time.Time) (bool, error) {
				return s.RenewDesktopWork(context.Background(), dref, tok, until)
			}},
		{"snapshots", leaseKeys{"wb:{snapshots}:work", "wb:{snapshots}:worker", "snapshot"}, sref.member(), sref.ID,
			func(s *Store, tok string, until time.Time) error {
				return s.SetSnapshotWork(context.Background(), sref, tok, until)
			},
			func(s *Store, tok string, until time.Time) (bool, error) {
				return s.RenewSnapshotWork(context.Background(), sref, tok, until)
			}},
	}
	for _, b := range redistest.Backends() {
		for _, f := range families {
			t.Run(b.Name+"/"+f.name, func(t *testing.T) {
				ctx := context.Background()
				s := New(b.New(t))
				now := time.Now().Truncate(time.Millisecond)
				// This release's work runs: its lease ends in a minute.
				if err := f.set(s, "tok_new", now.Add(time.Minute)); err != nil {
					t.Fatal(err)
				}
				// The older binary's ensure (due now, as leaseOrphan sets it), then its
				// recovery's claim: the ops it runs, on the lease set it reads.
				ensured, err := s.lease(ctx, f.legacy, "ensure", f.member, f.id, "", now, now)
				if err != nil {
					t.Fatal(err)
				}
				claimed, err := s.lease(ctx, f.legacy, "claim", f.member, f.id, "tok_old", now.Add(time.Minute), now)
				if err != nil {
					t.Fatal(err)
				}
				if ensured || claimed {
					t.Errorf("this release's lease runs for a minute, and an older binary ensured one beside it (%v) and its recovery claimed it (%v): two gateways work on it", ensured, claimed)
				}
				if ok, err := f.renew(s, "tok_new", now.Add(time.Minute)); err != nil || !ok {
					t.Fatalf("this release's work renewed its lease: %v, %v; want renewed", ok, err)
				}
				// An older gateway's newer request supersedes the lease.
				if _, err := s.lease(ctx, f.legacy, "set", f.member, f.id, "tok_old_set", now.Add(time.Minute), now); err != nil {
					t.Fatal(err)
				}
				if ok, err := f.renew(s, "tok_new", now.Add(time.Minute)); err != nil || ok {
					t.Errorf("an older binary's set superseded the lease, and this release's work renewed its own still (%v, %v)", ok, err)
				}
			})
		}
	}
}

// TestClaimAfterACrashBeforeTheYield: a recovery that claims the other release's lapsed
// lease (an older gateway's in the key of before the shards, or the next release's in its
// shard) and dies after it set the lease in its own keys but before the yield leaves the
// lease in both, ending together. The next recovery, of either release, claims one of them;
// it takes the end off the other too, so that once it has done the work and released the
// lease nothing is due: before, the other copy stayed due and was claimed, and the work
// recovered, a second time (racing a later transition of the desktop).
func TestClaimAfterACrashBeforeTheYield(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		for _, crashed := range []bool{false, true} {
			for _, next := range []bool{false, true} {
				release := map[bool]string{false: "this", true: "next"}
				t.Run(b.Name+"/"+release[crashed]+"-then-"+release[next], func(t *testing.T) {
					ctx := context.Background()
					rdb := b.New(t)
					stores := map[bool]*Store{false: New(rdb), true: New(rdb, withLeasesInShards())}
					c, r := stores[crashed], stores[next]
					now := time.Now().Truncate(time.Millisecond)
					ref := DesktopRef{Project: "proj_c", ID: "desk_c"}
					m := ref.member()
					own, other := c.desktopLeases.keys(ref.ID)
					must := func(ok bool, err error) {
						t.Helper()
						if err != nil || !ok {
							t.Fatal(ok, err)
						}
					}
					// The other release's lease, lapsed; the recovery's claimSharded, up to
					// the yield.
					must(c.lease(ctx, other, "set", m, ref.ID, "old_tok", now.Add(-time.Minute), now))
					must(c.lease(ctx, other, "claim", m, ref.ID, "tok_r1", now.Add(time.Second), now))
					must(c.lease(ctx, own, "ensure", m, ref.ID, "tok_r1", now.Add(time.Second), now))
					// Later, the next recovery claims it, does the work and releases it.
					later := now.Add(2 * time.Second)
					if ok, err := r.ClaimDesktopWork(ctx, ref, "tok_r2", later, later.Add(time.Minute)); err != nil || !ok {
						t.Fatalf("the next recovery's claim: %v, %v", ok, err)
					}
					if ok, err := r.ReleaseDesktopWork(ctx, ref, "tok_r2"); err != nil || !ok {
						t.Fatalf("the next recovery's release: %v, %v", ok, err)
					}
					for _, s := range stores {
						due, _, err := s.DueDesktopWork(ctx, later.Add(time.Hour), 10)
						if err != nil {
							t.Fatal(err)
						}
						again, err := s.ClaimDesktopWork(ctx, ref, "tok_r3", later.Add(time.Hour), later.Add(2*time.Hour))
						if err != nil {
							t.Fatal(err)
						}
						if len(due) != 0 || again {
							t.Errorf("after the work was recovered and its lease released: due %v, claimed again %v; want none", due, again)
						}
					}
				})
			}
		}
	}
}
