package node

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"wb/hypervisor"
	"wb/session"
)

// lostCheckpoint is cpuCounters whose memory snapshots fail after stopping the guest (runsc's
// refused save), whose disk snapshots work, and whose stopped guests say so.
type lostCheckpoint struct {
	cpuCounters
	stopped map[string]bool // by guest id, under mu
}

func (d lostCheckpoint) Snapshot(_ context.Context, id, dir string, memory bool) (hypervisor.SnapshotInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if memory {
		d.stopped[id] = true
		return hypervisor.SnapshotInfo{}, errors.New("checkpoint failed: endpoint still has waiters upon save")
	}
	if !d.stopped[id] {
		return hypervisor.SnapshotInfo{}, errors.New("a disk snapshot of a guest that runs")
	}
	return hypervisor.SnapshotInfo{SizeBytes: 1}, os.MkdirAll(dir, 0o700)
}

func (d lostCheckpoint) Info(_ context.Context, id string) (hypervisor.Info, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped[id] {
		return hypervisor.Info{State: hypervisor.StateStopped}, nil
	}
	return hypervisor.Info{State: hypervisor.StateRunning, Pid: 1}, nil
}

func (lostCheckpoint) Stop(context.Context, string) error { return nil }

func (lostCheckpoint) Name() string { return "losttest" }

// TestFailedCheckpointBillsOnce: a memory snapshot whose checkpoint fails and stops the guest
// replaces it with a guest booted from its disk, billed as the restore after a memory
// snapshot is: the old guest's CPU since its last sample before the checkpoint, the new
// guest's counter from zero, nothing twice; the session stays running, and /metrics counts
// the restart.
func TestFailedCheckpointBillsOnce(t *testing.T) {
	d := lostCheckpoint{cpuCounters: cpuCounters{t: t, mu: &sync.Mutex{}, cpu: map[string]int64{}}, stopped: map[string]bool{}}
	m := NewMetrics()
	const old = "g_old"
	n, l := snapshotNode(t, d, m, "sess_ckpt", "proj_ckpt", old, 10_000)
	d.set(old, 12_000) // 2 s of CPU since the last sample, then the checkpoint
	_, err := n.takeSnapshot(context.Background(), &session.Session{ID: "sess_ckpt", ProjectID: "proj_ckpt"}, "snap_0123456789abcdefgh", true)
	if err == nil || !strings.Contains(err.Error(), "restarted from its disk") {
		t.Fatalf("the snapshot whose checkpoint stopped the guest: %v; want its failure, the session restarted from its disk", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.g.State != session.Running || l.g.GuestID == old {
		t.Fatalf("after the failed checkpoint the session is %s on guest %s (the old one: %s)", l.g.State, l.g.GuestID, old)
	}
	d.set(old, 13_000) // what the old guest's counter may still say: never billed again
	billedBothGuests(t, n, l, d.cpuCounters)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if want := `wb_node_checkpoint_stopped_guests_total{outcome="restarted"} 1`; !strings.Contains(rec.Body.String(), want+"\n") {
		t.Errorf("/metrics lacks %s:\n%s", want, grepMetrics(rec.Body.String(), "wb_node_"))
	}
}

// endedCheckpoint is cpuCounters whose memory snapshot ends its caller's context and fails,
// the guest untouched and running, and whose Info reads the guest's state under the context
// it is given, as runsc state, a command started with it, does.
type endedCheckpoint struct {
	cpuCounters
	cancel  context.CancelFunc
	stopped *[]string
}

func (d endedCheckpoint) Snapshot(ctx context.Context, id, dir string, memory bool) (hypervisor.SnapshotInfo, error) {
	if !memory {
		return hypervisor.SnapshotInfo{SizeBytes: 1}, os.MkdirAll(dir, 0o700)
	}
	d.cancel() // the snapshot's caller went away (its request ended) during the checkpoint
	return hypervisor.SnapshotInfo{}, errors.New("checkpoint failed: the sandbox refused the save, and runs on")
}

func (d endedCheckpoint) Info(ctx context.Context, id string) (hypervisor.Info, error) {
	if err := ctx.Err(); err != nil {
		return hypervisor.Info{}, err
	}
	return hypervisor.Info{State: hypervisor.StateRunning, Pid: 1}, nil
}

func (d endedCheckpoint) Stop(_ context.Context, id string) error {
	d.mu.Lock()
	*d.stopped = append(*d.stopped, id)
	d.mu.Unlock()
	return nil
}

func (endedCheckpoint) Name() string { return "endedtest" }

// TestCheckpointWithEndedContextKeepsTheGuest: a memory snapshot whose caller went away
// during its failed checkpoint (its context ended), which left the guest running, keeps it:
// the guest's state is read regardless of the caller, not taken for a stopped guest because
// the read could not start, which restarted the session from its disk and lost its
// processes.
func TestCheckpointWithEndedContextKeepsTheGuest(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stopped []string
	d := endedCheckpoint{cpuCounters: cpuCounters{t: t, mu: &sync.Mutex{}, cpu: map[string]int64{}}, cancel: cancel, stopped: &stopped}
	const old = "g_old"
	n, l := snapshotNode(t, d, nil, "sess_ended", "proj_ended", old, 0)
	_, err := n.takeSnapshot(ctx, &session.Session{ID: "sess_ended", ProjectID: "proj_ended"}, "snap_0123456789abcdefgh", true)
	if err == nil {
		t.Fatal("a snapshot whose checkpoint answered its ended context succeeded")
	}
	if strings.Contains(err.Error(), "did not come back") {
		t.Errorf("the snapshot answered %q; want the checkpoint's failure, its agent back (the caller's going away is no sign it is not)", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if l.g.GuestID != old || len(stopped) > 0 || strings.Contains(err.Error(), "restarted from its disk") {
		t.Fatalf("a checkpoint that left its guest running, whose caller went away, answered %q; the session is %s on guest %s (was %s), guests stopped %v; want the running guest kept",
			err, l.g.State, l.g.GuestID, old, stopped)
	}
}

// deletesRecorded is lostCheckpoint that records the guests it deletes.
type deletesRecorded struct {
	lostCheckpoint
	deleted *[]string
}

func (d deletesRecorded) Delete(_ context.Context, id string) error {
	d.mu.Lock()
	*d.deleted = append(*d.deleted, id)
	d.mu.Unlock()
	return nil
}

// TestRestartFromDiskWhileWindingDownDeletesTheOldGuest: a memory snapshot whose checkpoint
// stopped the guest while the node winds down (it starts no background work then) still
// deletes the old guest and removes its dir, which holds the copy of its disk the restart
// was booted from: the deletion was left to a background start that was refused.
func TestRestartFromDiskWhileWindingDownDeletesTheOldGuest(t *testing.T) {
	var deleted []string
	d := deletesRecorded{lostCheckpoint: lostCheckpoint{cpuCounters: cpuCounters{t: t, mu: &sync.Mutex{}, cpu: map[string]int64{}}, stopped: map[string]bool{}}, deleted: &deleted}
	const old = "g_old"
	n, _ := snapshotNode(t, d, nil, "sess_wind", "proj_wind", old, 0)
	n.windDown()
	_, err := n.takeSnapshot(context.Background(), &session.Session{ID: "sess_wind", ProjectID: "proj_wind"}, "snap_0123456789abcdefgh", true)
	if err == nil || !strings.Contains(err.Error(), "restarted from its disk") {
		t.Fatalf("the snapshot whose checkpoint stopped the guest: %v; want its failure, the session restarted from its disk", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.Contains(deleted, old) {
		t.Errorf("after the restart from disk while the node wound down, guests deleted: %v; want the old one, %s", deleted, old)
	}
	if _, serr := os.Stat(n.guestDir(old)); serr == nil {
		t.Errorf("after the restart from disk while the node wound down the old guest's dir %s is left", n.guestDir(old))
	}
}

// savedAnyway is cpuCounters whose memory snapshot's caller goes away during the save,
// which the sandbox makes all the same (runsc's save goes on whatever its caller does, and
// stops the guest): to a caller whose context ended it answers that, the answer lost, and to
// one still there the snapshot. Its Info reads under the context it is given, as runsc state.
type savedAnyway struct {
	cpuCounters
	cancel context.CancelFunc
	state  map[string]string // "stopped", "disk" (a disk snapshot was taken), by guest id, under mu
}

func (d savedAnyway) Snapshot(ctx context.Context, id, dir string, memory bool) (hypervisor.SnapshotInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !memory {
		d.state["disk"] = id
		return hypervisor.SnapshotInfo{SizeBytes: 1}, os.MkdirAll(dir, 0o700)
	}
	d.cancel() // the caller goes away while the sandbox saves
	d.state[id] = "stopped"
	if err := ctx.Err(); err != nil {
		return hypervisor.SnapshotInfo{}, err
	}
	return hypervisor.SnapshotInfo{Memory: true, SizeBytes: 1}, os.MkdirAll(dir, 0o700)
}

func (d savedAnyway) Info(ctx context.Context, id string) (hypervisor.Info, error) {
	if err := ctx.Err(); err != nil {
		return hypervisor.Info{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state[id] == "stopped" {
		return hypervisor.Info{State: hypervisor.StateStopped}, nil
	}
	return hypervisor.Info{State: hypervisor.StateRunning, Pid: 1}, nil
}

func (savedAnyway) Stop(context.Context, string) error { return nil }

func (savedAnyway) Name() string { return "savedtest" }

// TestCheckpointOutlivesItsCaller: a memory snapshot whose caller goes away while the guest
// is saved waits for the save's answer all the same: the save goes on in the sandbox and
// stops the guest whatever the caller does, and a wait cut short took the saved guest for a
// failed checkpoint, which restarted the session from its disk and lost its processes.
func TestCheckpointOutlivesItsCaller(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := savedAnyway{cpuCounters: cpuCounters{t: t, mu: &sync.Mutex{}, cpu: map[string]int64{}}, cancel: cancel, state: map[string]string{}}
	const old = "g_old"
	n, l := snapshotNode(t, d, nil, "sess_gone", "proj_gone", old, 0)
	_, err := n.takeSnapshot(ctx, &session.Session{ID: "sess_gone", ProjectID: "proj_gone"}, "snap_0123456789abcdefgh", true)
	l.mu.Lock() // the restore after the checkpoint holds it until the guest is back
	defer l.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil || d.state["disk"] != "" {
		t.Fatalf("a memory snapshot saved while its caller went away answered %v (disk snapshots taken of %q); want it taken, the guest restored from its memory", err, d.state["disk"])
	}
	if l.g.State != session.Running || l.g.GuestID == old {
		t.Fatalf("after the snapshot the session is %s on guest %s (the old one: %s)", l.g.State, l.g.GuestID, old)
	}
}
