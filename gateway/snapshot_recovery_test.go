package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/internal/testwait"
	"wb/session"
	"wb/store"
)

// snapshotInFlight waits until the gateway gw takes a snapshot of the session, and answers
// the snapshot's id.
func snapshotInFlight(t *testing.T, gw *Server, ref store.SessionRef) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if id, ok := gw.snapshots.working(ref); ok {
			return id
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the gateway never began the snapshot")
	return ""
}

// TestSnapshotSurvivesItsGateway: a session left in snapshotting by a gateway that died while
// the node took the snapshot (its lease taken, the snapshot unrecorded) runs again once the
// lease runs out, and the snapshot is recorded failed. Before, it stayed in snapshotting for
// ever: billed, and its delete refused.
func TestSnapshotSurvivesItsGateway(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkLease = time.Second })
	s := e.running(map[string]any{"tier": 2})
	ctx := context.Background()
	cur, err := e.st.Get(ctx, e.projA, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Transition(ctx, store.Change{Project: e.projA, ID: s.ID, From: session.Running, To: session.Snapshotting,
		Driver: session.Caller, Version: cur.Version}); err != nil {
		t.Fatal(err)
	}
	ref := store.SessionRef{Project: e.projA, ID: s.ID}
	if err := e.st.SetSnapshotWork(ctx, ref, "snap_ofTheDead", time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	e.waitState(e.key, s.ID, session.Running)
	var snap session.Snapshot
	e.mustDo("GET", "/v1/snapshots/snap_ofTheDead", e.key, nil, 200, &snap)
	if snap.State != session.SnapshotFailed || snap.SessionID != s.ID || !strings.Contains(snap.FailureReason, "stopped before it was done") {
		t.Errorf("the dead gateway's snapshot: %+v, want failed, of %s, its failure_reason saying its gateway stopped", snap, s.ID)
	}
	if due, next, err := e.st.DueSnapshotWork(ctx, time.Now().Add(time.Hour), 10); err != nil || len(due) != 0 || !next.IsZero() {
		t.Errorf("leases left after the recovery: %v %v %v", due, next, err)
	}
	e.mustDo("DELETE", "/v1/sessions/"+s.ID, e.key, nil, 202, nil)
	e.waitState(e.key, s.ID, session.Stopped)
}

// TestSlowSnapshotKeepsItsLease: a snapshot that outlasts its lease many times over is not
// ended by another gateway's recovery, since its gateway renews the lease while it works;
// once done, the lease is released.
func TestSlowSnapshotKeepsItsLease(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkLease = 3 * time.Second })
	s := e.running(map[string]any{"tier": 2})
	other := e.gw
	e.secondGateway(nil) // takes the snapshot; the first gateway looks on
	e.node.SetSnapshotDelay(6 * time.Second)
	answer := make(chan response, 1)
	go func() { answer <- e.do("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, nil) }()
	ref := store.SessionRef{Project: e.projA, ID: s.ID}
	deadline := time.Now().Add(time.Minute)
	for e.sessionOf(s.ID).State != session.Snapshotting && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(4500 * time.Millisecond) // past the lease as first taken
	other.recoverSnapshot(context.Background(), ref, time.Now())
	if st := e.sessionOf(s.ID).State; st != session.Snapshotting {
		t.Errorf("4.5 s into a snapshot with a 3 s lease the session is %s, want snapshotting", st)
	}
	r := <-answer
	if r.status != 201 {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	e.waitState(e.key, s.ID, session.Running)
	var list struct{ Data []session.Snapshot }
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &list)
	if len(list.Data) != 1 || list.Data[0].State != session.SnapshotReady {
		t.Errorf("snapshots after it: %+v, want one ready", list.Data)
	}
	if due, next, err := e.st.DueSnapshotWork(context.Background(), time.Now().Add(time.Hour), 10); err != nil || len(due) != 0 || !next.IsZero() {
		t.Errorf("leases left after the snapshot: %v %v %v", due, next, err)
	}
}

// TestSnapshotRecoveryLeavesItsOwnWork: a snapshot lease that lapsed while this gateway
// still takes the snapshot (its renewals came late) is renewed by this gateway's recovery,
// not ended. Another gateway's recovery does end it; the snapshot's own gateway then records
// it as taken and answers it, and the session runs.
func TestSnapshotRecoveryLeavesItsOwnWork(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkLease = time.Minute }) // renewed every 20 s: not while the test looks
	s := e.running(map[string]any{"tier": 2})
	e.node.SetSnapshotDelay(5 * time.Second)
	answer := make(chan response, 1)
	go func() { answer <- e.do("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, nil) }()
	ctx := context.Background()
	ref := store.SessionRef{Project: e.projA, ID: s.ID}
	snapID := snapshotInFlight(t, e.gw, ref)
	lapse := func() {
		t.Helper()
		if err := e.st.SetSnapshotWork(ctx, ref, snapID, time.Now().Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	lapse()
	e.gw.recoverSnapshot(ctx, ref, time.Now())
	if st := e.sessionOf(s.ID).State; st != session.Snapshotting {
		t.Fatalf("after its own gateway's recovery the session is %s, want snapshotting", st)
	}
	if due, _, err := e.st.DueSnapshotWork(ctx, time.Now(), 10); err != nil || len(due) != 0 {
		t.Fatalf("after its own gateway's recovery the lease is still lapsed: %v %v", due, err)
	}

	lapse()
	other := e.secondGateway(nil)
	other.recoverSnapshot(ctx, ref, time.Now())
	// The other gateway's own recovery loop may have claimed the lapsed lease first, and end
	// the snapshot a moment later (a loaded cold run looked too soon).
	testwait.For(t, 30*time.Second, "the session running after another gateway's recovery", func() bool {
		return e.sessionOf(s.ID).State == session.Running
	})
	r := <-answer
	if r.status != 201 {
		t.Fatalf("the snapshot its recovery ended, once taken: %d %s", r.status, r.body)
	}
	var snap session.Snapshot
	e.mustDo("GET", "/v1/snapshots/"+snapID, e.key, nil, 200, &snap)
	if snap.State != session.SnapshotReady {
		t.Errorf("the snapshot taken after all is %s, want ready", snap.State)
	}
	if st := e.sessionOf(s.ID).State; st != session.Running {
		t.Errorf("the session after it all is %s, want running", st)
	}
}

// TestLateCloseSparesTheNextSnapshot: a gateway whose snapshot lease lapsed while it still
// took the snapshot (alive, its renewals late) finds, once done, that another gateway's
// recovery ended the snapshot and that the session takes its next snapshot. Its move back to
// running must not end that one: it names its own snapshot, which the session no longer takes.
// Before, it moved the session to running in the middle of the next snapshot.
func TestLateCloseSparesTheNextSnapshot(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkLease = time.Minute }) // renewed every 20 s: not while the test looks
	s := e.running(map[string]any{"tier": 2})
	e.node.SetSnapshotDelay(5 * time.Second)
	first := make(chan response, 1)
	go func() { first <- e.do("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, nil) }()
	ctx := context.Background()
	ref := store.SessionRef{Project: e.projA, ID: s.ID}
	snapID := snapshotInFlight(t, e.gw, ref)
	if err := e.st.SetSnapshotWork(ctx, ref, snapID, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	other := e.secondGateway(nil) // e.do now goes to it
	other.recoverSnapshot(ctx, ref, time.Now())
	// The other gateway's own recovery loop may have claimed the lapsed lease first, and end
	// the snapshot a moment later (a loaded cold run looked too soon).
	testwait.For(t, 30*time.Second, "the session running after another gateway's recovery", func() bool {
		return e.sessionOf(s.ID).State == session.Running
	})
	e.node.SetSnapshotDelay(15 * time.Second) // the next one is still under way when the first ends
	second := make(chan response, 1)
	go func() { second <- e.do("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, nil) }()
	nextID := snapshotInFlight(t, other, ref)
	if r := <-first; r.status != 201 {
		t.Fatalf("the first snapshot, taken after its recovery: %d %s", r.status, r.body)
	}
	if st := e.sessionOf(s.ID).State; st != session.Snapshotting {
		t.Errorf("after the first snapshot's late close the session is %s, want snapshotting (taking %s)", st, nextID)
	}
	if r := <-second; r.status != 201 {
		t.Fatalf("the next snapshot: %d %s", r.status, r.body)
	}
	if st := e.sessionOf(s.ID).State; st != session.Running {
		t.Errorf("after the next snapshot the session is %s, want running", st)
	}
	for _, id := range []string{snapID, nextID} {
		var snap session.Snapshot
		e.mustDo("GET", "/v1/snapshots/"+id, e.key, nil, 200, &snap)
		if snap.State != session.SnapshotReady {
			t.Errorf("snapshot %s is %s, want ready", id, snap.State)
		}
	}
}

// TestStaleSnapshotLeaseSparesTheNext: the lease of a snapshot its gateway recorded, left
// because letting go of it failed, lapses while the session takes its next snapshot (moved to
// snapshotting, that snapshot's lease not yet taken). Its recovery lets go of the old lease
// and leaves the session snapshotting, since the session takes another snapshot; before, it
// moved the session back to running in the middle of the next snapshot. Should the next
// snapshot's gateway die before it takes its lease, the placer's sweep gives the session one,
// held by the snapshot it takes, whose recovery records that snapshot failed and ends it.
func TestStaleSnapshotLeaseSparesTheNext(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	ctx := context.Background()
	ref := store.SessionRef{Project: e.projA, ID: s.ID}
	cur := e.sessionOf(s.ID)
	done := session.Snapshot{ID: "snap_done", Object: "snapshot", SessionID: s.ID, State: session.SnapshotReady,
		CreatedAt: *session.At(time.Now()), Template: cur.Template, Tier: cur.Tier, NodeID: cur.NodeID}
	if err := e.st.PutObject(ctx, e.projA, store.KindSnapshot, done.ID, done); err != nil {
		t.Fatal(err)
	}
	if err := e.st.SetSnapshotWork(ctx, ref, done.ID, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Transition(ctx, store.Change{Project: e.projA, ID: s.ID, From: session.Running, To: session.Snapshotting,
		Driver: session.Caller, Snapshot: "snap_next"}); err != nil {
		t.Fatal(err)
	}
	leaseGone := func() bool {
		due, next, err := e.st.DueSnapshotWork(ctx, time.Now().Add(time.Hour), 10)
		return err == nil && len(due) == 0 && next.IsZero()
	}
	other := e.secondGateway(nil)
	other.recoverSnapshot(ctx, ref, time.Now())
	e.waitFor(leaseGone) // this recovery's, or the first gateway's own loop's
	if st := e.sessionOf(s.ID).State; st != session.Snapshotting {
		t.Fatalf("after the stale lease's recovery the session is %s, want snapshotting (its next snapshot)", st)
	}
	var snap session.Snapshot
	e.mustDo("GET", "/v1/snapshots/"+done.ID, e.key, nil, 200, &snap)
	if snap.State != session.SnapshotReady {
		t.Errorf("the recorded snapshot is %s after the recovery, want ready", snap.State)
	}

	// Nobody takes the next snapshot's lease: the placer's sweep gives one, which ends it.
	if err := e.st.EnsureSnapshotWork(ctx, ref, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	other.recoverSnapshot(ctx, ref, time.Now())
	e.waitState(e.key, s.ID, session.Running)
	if !leaseGone() {
		t.Error("the sweep's lease is left after its recovery")
	}
	e.mustDo("GET", "/v1/snapshots/snap_next", e.key, nil, 200, &snap)
	if snap.State != session.SnapshotFailed {
		t.Errorf("the next snapshot, whose gateway died, is %s after the sweep's recovery, want failed", snap.State)
	}
}

// TestSnapshotLeaseOfAStoppingSession: a gateway that died while the node saved a desktop's
// session as it stopped (the session stopping, the lease taken, the snapshot unrecorded)
// leaves a snapshot that the recovery records failed, so that its files can be found and
// deleted; the session is left stopping, for its stop to end.
func TestSnapshotLeaseOfAStoppingSession(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkLease = time.Second })
	s := e.running(map[string]any{"tier": 2})
	ctx := context.Background()
	if _, err := e.st.Transition(ctx, store.Change{Project: e.projA, ID: s.ID, From: session.Running, To: session.Stopping,
		Driver: session.Caller, Reason: session.Deleted}); err != nil {
		t.Fatal(err)
	}
	ref := store.SessionRef{Project: e.projA, ID: s.ID}
	if err := e.st.SetSnapshotWork(ctx, ref, "snap_sleepOfTheDead", time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	var snap session.Snapshot
	e.waitFor(func() bool {
		return e.do("GET", "/v1/snapshots/snap_sleepOfTheDead", e.key, nil).status == 200
	})
	e.mustDo("GET", "/v1/snapshots/snap_sleepOfTheDead", e.key, nil, 200, &snap)
	if snap.State != session.SnapshotFailed || snap.SessionID != s.ID {
		t.Errorf("the dead gateway's snapshot: %+v, want failed, of %s", snap, s.ID)
	}
	if st := e.sessionOf(s.ID).State; st != session.Stopping {
		t.Errorf("the session after the recovery is %s, want stopping still", st)
	}
	if due, next, err := e.st.DueSnapshotWork(ctx, time.Now().Add(time.Hour), 10); err != nil || len(due) != 0 || !next.IsZero() {
		t.Errorf("leases left after the recovery: %v %v %v", due, next, err)
	}
}

// TestSnapshotRecordedButNotReturned: a snapshot recorded whose session its gateway could not
// move back to running (Redis failed that one call) leaves its lease to run out, and the
// recovery returns the session to running, since it still takes that snapshot. (Once, the
// recovery took such a lease for a stale one and left the session snapshotting, billed and
// its delete refused, until the placer's sweep minutes later; then the gateway handed the
// lease to no holder.)
func TestSnapshotRecordedButNotReturned(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, func(c *Config) { c.WorkLease = time.Second })
	s := e.running(map[string]any{"tier": 2})
	failed := make(chan struct{}, 1)
	redistest.BeforeOnce(rdb, func(cmd redis.Cmder) bool {
		args := cmd.Args()
		for i := 0; i+2 < len(args); i++ {
			if fmt.Sprint(args[i]) == s.ID && fmt.Sprint(args[i+1]) == string(session.Snapshotting) && fmt.Sprint(args[i+2]) == string(session.Running) {
				return true
			}
		}
		return false
	}, func() error {
		failed <- struct{}{}
		return errors.New("test: Redis did not answer")
	})
	if r := e.do("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, nil); r.status < 500 {
		t.Fatalf("a snapshot whose session could not run again: %d %s", r.status, r.body)
	}
	select {
	case <-failed:
	default:
		t.Fatal("the snapshot's move back to running was never tried")
	}
	var list struct{ Data []session.Snapshot }
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &list)
	if len(list.Data) != 1 || list.Data[0].State != session.SnapshotReady {
		t.Fatalf("snapshots: %+v, want one ready", list.Data)
	}
	deadline := time.Now().Add(20 * time.Second) // the lease is a second; the recovery looks every lease/3
	for e.sessionOf(s.ID).State != session.Running {
		if time.Now().After(deadline) {
			t.Fatalf("the session is %s 20 s after its snapshot, want running", e.sessionOf(s.ID).State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var snap session.Snapshot
	e.mustDo("GET", "/v1/snapshots/"+list.Data[0].ID, e.key, nil, 200, &snap)
	if snap.State != session.SnapshotReady {
		t.Errorf("the snapshot is %s after the recovery, want ready", snap.State)
	}
}

// TestDeletedSnapshotStaysDeleted: a lease that outlived its recorded snapshot (letting go of
// it failed), whose snapshot was then deleted while the session runs, ends without bringing
// the snapshot back. Before, the recovery found no record and wrote one, failed: a snapshot
// the user had deleted showed again, and counted against the plan's snapshots.
func TestDeletedSnapshotStaysDeleted(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	ctx := context.Background()
	ref := store.SessionRef{Project: e.projA, ID: s.ID}
	if err := e.st.SetSnapshotWork(ctx, ref, "snap_deletedSince", time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	e.secondGateway(nil).recoverSnapshot(ctx, ref, time.Now())
	if r := e.do("GET", "/v1/snapshots/snap_deletedSince", e.key, nil); r.status != 404 {
		t.Errorf("the deleted snapshot after the recovery: %d %s, want 404", r.status, r.body)
	}
	if st := e.sessionOf(s.ID).State; st != session.Running {
		t.Errorf("the session after the recovery is %s, want running", st)
	}
	if due, next, err := e.st.DueSnapshotWork(ctx, time.Now().Add(time.Hour), 10); err != nil || len(due) != 0 || !next.IsZero() {
		t.Errorf("leases left after the recovery: %v %v %v", due, next, err)
	}
}
