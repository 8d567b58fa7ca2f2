package store

import (
	"context"
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
