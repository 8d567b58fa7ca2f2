package node_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/templates"
	"wb/session"
	"wb/store"
)

// errWaiters is runsc's refusal to save a guest that holds a TCP endpoint a process waits on
// (runsc 20221219, a guest's loopback listener), after which its sandbox has stopped.
var errWaiters = errors.New(`oci: runsc checkpoint g: checkpoint failed: encoding error at object tcp.endpoint{LocalPort:0x1388}: endpoint still has waiters upon save`)

// stoppingCheckpoint is a driver whose memory snapshots stop the guest and fail, as runsc's
// checkpoint does when the sandbox cannot save what the guest holds; with diskFails its
// disk-only snapshots fail too.
type stoppingCheckpoint struct {
	testDriver
	diskFails bool
}

func (d stoppingCheckpoint) Snapshot(ctx context.Context, id, dir string, memory bool) (hypervisor.SnapshotInfo, error) {
	if !memory {
		if d.diskFails {
			return hypervisor.SnapshotInfo{}, errors.New("a disk that cannot be read")
		}
		return d.testDriver.Snapshot(ctx, id, dir, false)
	}
	if err := d.testDriver.Stop(ctx, id); err != nil {
		return hypervisor.SnapshotInfo{}, err
	}
	return hypervisor.SnapshotInfo{}, errWaiters
}

// snapshotAsTheGateway snapshots s with memory as the gateway does: the session to
// snapshotting, the node's snapshot, the session back to running (which must succeed
// whatever the snapshot's outcome). It answers the node's error.
func snapshotAsTheGateway(t *testing.T, st *store.Store, n interface {
	Snapshot(context.Context, *session.Session, string, bool) (hypervisor.SnapshotInfo, error)
}, s *session.Session) error {
	t.Helper()
	ctx := ctxT(t, 5*time.Minute)
	cur, err := st.Transition(ctx, store.Change{Project: s.ProjectID, ID: s.ID, From: session.Running, To: session.Snapshotting, Driver: session.Caller})
	if err != nil {
		t.Fatal(err)
	}
	info, snapErr := n.Snapshot(ctx, cur, session.NewID("snap_", time.Now()), true)
	if snapErr == nil {
		t.Errorf("a snapshot whose checkpoint failed answered %+v and no error", info)
	}
	if _, err := st.Transition(ctx, store.Change{Project: s.ProjectID, ID: s.ID, From: session.Snapshotting, To: session.Running, Driver: session.Caller}); err != nil {
		var ce *store.ConflictError
		if !errors.As(err, &ce) {
			t.Fatal(err)
		}
		t.Logf("the session left snapshotting before the snapshot was answered: %v", err)
	}
	return snapErr
}

// TestFailedCheckpointRestartsFromDisk: a memory snapshot whose checkpoint fails and stops the
// guest (runsc: "endpoint still has waiters upon save") fails, saying so, and the session
// goes on running as a new guest booted from the old one's disk: its files kept, its
// processes gone, the old guest deleted. Before, the snapshot answered "checkpoint stopped
// the guest" and nothing brought the guest back: the session failed (guest_crash).
func TestFailedCheckpointRestartsFromDisk(t *testing.T) {
	t.Parallel()
	const project = "proj_ckptfail"
	st, d, n := runscNode(t, "node_ckptfail", func(d testDriver) hypervisor.Driver { return stoppingCheckpoint{testDriver: d} })
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
	ctx := ctxT(t, 5*time.Minute)
	if res, err := execIn(ctx, n.Node, s, "echo kept > /workspace/f; sleep 3600 </dev/null >/dev/null 2>&1 &"); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	err := snapshotAsTheGateway(t, st, n.Node, s)
	if err == nil || !strings.Contains(err.Error(), "checkpoint failed") || !strings.Contains(err.Error(), "restarted from its disk") {
		t.Errorf("the failed snapshot's error: %v; want one that says the checkpoint failed and the session was restarted from its disk", err)
	}
	// The session runs on, its files kept and its processes gone.
	res, err := execIn(ctx, n.Node, get(t, st, project, s.ID),
		`cat /workspace/f; for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done | grep -c '^sleep 3600' || true`)
	if err != nil || res.Stdout != "kept\n0\n" {
		t.Errorf("an exec after the failed snapshot: %+v, %v; want the file kept and the sleep gone", res, err)
	}
	runsOnAfterRestart(t, st, d, project, s.ID)
	// The restarted guest is the session's for good: its next snapshot, disk only, works.
	if info, err := n.Snapshot(ctx, get(t, st, project, s.ID), session.NewID("snap_", time.Now()), false); err != nil || info.SizeBytes <= 0 {
		t.Errorf("a disk snapshot of the restarted guest: %+v, %v", info, err)
	}
}

// TestFailedCheckpointWithoutDiskFailsTheSession: when the guest's disk cannot be used either,
// the session fails (guest_crash), never left running without a guest, and the snapshot's
// error says so.
func TestFailedCheckpointWithoutDiskFailsTheSession(t *testing.T) {
	t.Parallel()
	const project = "proj_ckptlost"
	st, d, n := runscNode(t, "node_ckptlost", func(d testDriver) hypervisor.Driver { return stoppingCheckpoint{testDriver: d, diskFails: true} })
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
	err := snapshotAsTheGateway(t, st, n.Node, s)
	if err == nil || !strings.Contains(err.Error(), "checkpoint failed") || !strings.Contains(err.Error(), "could not be restarted from its disk") {
		t.Errorf("the failed snapshot's error: %v; want one that says the checkpoint failed and the guest could not be restarted", err)
	}
	got, _ := waitState(t, st, project, s.ID, time.Minute, session.Failed, session.Stopped, session.Expired)
	if got.State != session.Failed || got.StateReason == nil || *got.StateReason != session.GuestCrash {
		t.Fatalf("the session whose guest was lost: %s %s, want failed (guest_crash)", got.State, reasonOf(got))
	}
	if err := waitGuestGone(t, d, s.ID, time.Minute); err != nil {
		t.Errorf("the guest the checkpoint stopped: %v", err)
	}
}

// TestFailedRunscCheckpointRestartsFromDisk is TestFailedCheckpointRestartsFromDisk with
// runsc's own refusal: a guest process that waits in epoll on a loopback TCP listener holds
// an endpoint with a waiter, which runsc 20221219 refuses to save, and its failed save stops
// the sandbox. (A process blocked in accept or read is not one: stopping the guest's tasks
// for the save takes their waiters off, and both ends of an idle connection were saved.)
func TestFailedRunscCheckpointRestartsFromDisk(t *testing.T) {
	t.Parallel()
	const project = "proj_ckptreal"
	// The driver bare, as a node runs it: its optional interfaces (a LayerAdopter's restore) in use.
	st, d, n := runscNode(t, "node_ckptreal", nil)
	tpl := catalog[templates.DevPolyglot] // the host's python3
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 600, lifeS: 1200, template: tpl.Name + "@" + tpl.Digest})
	ctx := ctxT(t, 5*time.Minute)
	const epoller = `'import select, socket; s = socket.socket(); s.bind(("127.0.0.1", 5000)); s.listen(); e = select.epoll(); e.register(s.fileno(), select.EPOLLIN); e.poll()'`
	if res, err := execIn(ctx, n.Node, s, "echo kept > /workspace/f; python3 -c "+epoller+" </dev/null >/dev/null 2>&1 & sleep 2; netstat -ltn | grep -c ':5000 '"); err != nil || res.Stdout != "1\n" {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	err := snapshotAsTheGateway(t, st, n.Node, s)
	t.Logf("the snapshot's error: %v", err)
	if err == nil || !strings.Contains(err.Error(), "restarted from its disk") {
		t.Errorf("the failed snapshot's error: %v; want one that says the session was restarted from its disk", err)
	}
	res, err := execIn(ctx, n.Node, get(t, st, project, s.ID), "cat /workspace/f; netstat -ltn | grep -c ':5000 ' || true")
	if err != nil || res.Stdout != "kept\n0\n" {
		t.Errorf("an exec after the failed snapshot: %+v, %v; want the file kept and the listener gone", res, err)
	}
	runsOnAfterRestart(t, st, d, project, s.ID)
}

// runsOnAfterRestart checks that session id, restarted from its disk after its memory
// snapshot's checkpoint stopped its guest, stays running a moment later (nothing ends it)
// and that the stopped guest is gone.
func runsOnAfterRestart(t *testing.T, st *store.Store, d testDriver, project, id string) {
	t.Helper()
	time.Sleep(3 * time.Second)
	if got := get(t, st, project, id); got.State != session.Running {
		t.Fatalf("after the failed snapshot the session is %s %s, want running", got.State, reasonOf(got))
	}
	if err := waitGuestGone(t, d, id, time.Minute); err != nil {
		t.Errorf("the guest the checkpoint stopped: %v", err)
	}
}
