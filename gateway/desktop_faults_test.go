package gateway

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/desktop"
	"wb/hypervisor"
	"wb/internal/fakenode"
	"wb/internal/redistest"
	"wb/session"
)

// TestWakeDropsTheStateItRestored: the saved state a wake restored from goes when the next
// sleep saves a new one; before, each sleep and wake left one memory snapshot behind, billed
// and counted against the project's snapshots until the quota refused every sleep's state.
func TestWakeDropsTheStateItRestored(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "cycles"})
	e.desktopAction(d.ID, "sleep", 202)
	e.waitDesktop(d.ID, desktop.Asleep)
	first := e.memorySnapshotOf(d.ID)
	e.desktopAction(d.ID, "wake", 202)
	e.waitDesktop(d.ID, desktop.Running)
	e.desktopAction(d.ID, "sleep", 202)
	e.waitDesktop(d.ID, desktop.Asleep)
	if second := e.memorySnapshotOf(d.ID); second == first || second == "" {
		t.Fatalf("second sleep's state %q, first %q", second, first)
	}
	if e.snapshotExists(first) {
		t.Errorf("the state the wake restored (%s) is kept after the next sleep saved another", first)
	}
	// A stop ends the state the last wake restored from too: stopped keeps none.
	e.desktopAction(d.ID, "wake", 202)
	e.waitDesktop(d.ID, desktop.Running)
	woken := e.memorySnapshotOf(d.ID)
	e.desktopAction(d.ID, "stop", 202)
	e.waitDesktop(d.ID, desktop.Stopped)
	if e.snapshotExists(woken) || e.memorySnapshotOf(d.ID) != "" {
		t.Errorf("a stopped desktop keeps the state it was woken from (%s)", woken)
	}
}

// TestResizeDuringSleepDropsTheState: seed 001, "a snapshot belongs to the size it was taken
// at … a session with a resize waiting goes to sleep without one", also when the resize comes
// while the sleep saves the state. Before, the desktop woke at the new size from a state of the
// old one.
func TestResizeDuringSleepDropsTheState(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "grow"})
	e.node.SetSnapshotDelay(2 * time.Second) // the PATCH comes while the sleep saves
	e.desktopAction(d.ID, "sleep", 202)
	var patched desktop.Desktop
	e.mustDo("PATCH", "/v1/desktops/"+d.ID, e.key, map[string]any{"size": "m"}, 200, &patched)
	if patched.State != desktop.Stopping {
		t.Fatalf("patched in %s, want stopping", patched.State)
	}
	d = e.waitDesktop(d.ID, desktop.Asleep)
	if d.Size != "m" || d.StateSaved || e.memorySnapshotOf(d.ID) != "" || !strings.Contains(d.Message, "resized") {
		t.Errorf("asleep after a resize during the sleep: size %s, state_saved %v, memory snapshot %q, message %q; want m, no state kept",
			d.Size, d.StateSaved, e.memorySnapshotOf(d.ID), d.Message)
	}
	e.node.SetSnapshotDelay(0)
	e.desktopAction(d.ID, "wake", 202)
	d = e.waitDesktop(d.ID, desktop.Running)
	if s := e.sessionOf(d.SessionID); s.RestoreFrom != nil {
		var snap session.Snapshot
		e.mustDo("GET", "/v1/snapshots/"+*s.RestoreFrom, e.key, nil, 200, &snap)
		if snap.IncludeMemory {
			t.Errorf("woke at size %s from memory snapshot %s, taken at size s", s.Resources.SizeClass, snap.ID)
		}
	}
}

// TestWakeWithItsStateDeleted: a wake whose saved state the caller deleted (DELETE
// /v1/snapshots/{id}) is refused at admission (restore_from); it wakes from the disk, "state
// not saved", as a state that cannot be restored (seed 001), where it went to failed before.
func TestWakeWithItsStateDeleted(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "gone"})
	e.desktopAction(d.ID, "sleep", 202)
	e.waitDesktop(d.ID, desktop.Asleep)
	e.mustDo("DELETE", "/v1/snapshots/"+e.memorySnapshotOf(d.ID), e.key, nil, 200, nil)
	e.desktopAction(d.ID, "wake", 202)
	deadline := time.Now().Add(30 * time.Second)
	for d = e.desktop(d.ID); d.State == desktop.Starting && time.Now().Before(deadline); d = e.desktop(d.ID) {
		time.Sleep(20 * time.Millisecond)
	}
	if d.State != desktop.Running || !strings.HasPrefix(d.Message, "state not saved") {
		t.Errorf("a wake whose state was deleted ended %s (%s), want running, state not saved", d.State, d.Message)
	}
}

// slowSnapshotDeletes holds every DeleteSnapshot until gate is closed.
type slowSnapshotDeletes struct {
	*fakenode.Node
	gate chan struct{}
}

func (n slowSnapshotDeletes) DeleteSnapshot(ctx context.Context, id string) error {
	<-n.gate
	return n.Node.DeleteSnapshot(ctx, id)
}

// TestWakeDuringASleepsCleanupFallsIdle: a sleep whose last steps are slow (the node deletes
// the old disk's files) once forgot the idle deadline after them, when a wake had set its own:
// the woken desktop then never fell idle, and billed until its session's own timeout.
func TestWakeDuringASleepsCleanupFallsIdle(t *testing.T) {
	gate := make(chan struct{})
	e := newEnv(t, func(c *Config) {
		c.DesktopIdle = 5 * time.Second // long enough for each step to come before it on a loaded host
		c.Guests = slowSnapshotDeletes{Node: c.Guests.(*fakenode.Node), gate: gate}
	})
	d := e.newDesktop(map[string]any{"name": "idle"})
	e.desktopAction(d.ID, "sleep", 202)
	e.waitDesktop(d.ID, desktop.Asleep)
	e.desktopAction(d.ID, "wake", 202)
	e.waitDesktop(d.ID, desktop.Running)
	e.desktopAction(d.ID, "sleep", 202) // it has an old disk to delete now, and that is slow
	e.waitDesktop(d.ID, desktop.Asleep)
	e.desktopAction(d.ID, "wake", 202)
	e.waitDesktop(d.ID, desktop.Running)
	close(gate)
	deadline := time.Now().Add(60 * time.Second) // idle after 5 s unused
	for d = e.desktop(d.ID); d.State == desktop.Running && time.Now().Before(deadline); d = e.desktop(d.ID) {
		time.Sleep(50 * time.Millisecond)
	}
	if d.State == desktop.Running {
		t.Errorf("the desktop woken during a sleep's cleanup is running 60 s later, its idle time 5 s")
	}
}

// processHook is a go-redis hook that hands each command to the function (with the next
// hook to call), and lets dials and pipelines through.
type processHook func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error

func (h processHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h processHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h processHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { return h(ctx, cmd, next) }
}

// scriptWith reports whether cmd runs a script with an argument that contains part.
func scriptWith(cmd redis.Cmder, part string) bool {
	return (cmd.Name() == "evalsha" || cmd.Name() == "eval") && argHas(cmd, part)
}

// resetError is what a command whose connection a failover reset answers.
func resetError(cmd redis.Cmder) error {
	err := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	cmd.SetErr(err)
	return err
}

// failDesktopWrite fails the first write of a desktop record once armed, as a failover would
// (its reads go through: the test reads the desktop meanwhile).
func failDesktopWrite(armed *atomic.Bool) processHook {
	return func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if scriptWith(cmd, ":d:desk_") && armed.CompareAndSwap(true, false) {
			return resetError(cmd)
		}
		return next(ctx, cmd)
	}
}

// argHas reports whether one of cmd's arguments contains part.
func argHas(cmd redis.Cmder, part string) bool {
	for _, a := range cmd.Args() {
		s := fmt.Sprint(a)
		if b, ok := a.([]byte); ok {
			s = string(b)
		}
		if strings.Contains(s, part) {
			return true
		}
	}
	return false
}

// armedAfterSaving arms armed once a sleep has saved the state: the next write of the record
// is the one that records the sleep's end.
type armedAfterSaving struct {
	*fakenode.Node
	armed *atomic.Bool
}

func (n armedAfterSaving) StopSaving(ctx context.Context, s *session.Session, id string) (hypervisor.SnapshotInfo, error) {
	info, err := n.Node.StopSaving(ctx, s, id)
	n.armed.Store(true)
	return info, err
}

// TestSleepRecordedThroughARedisBlip: one failed Redis write as a sleep records its end once
// made the sleep delete the snapshots it had just taken, as if the desktop had been deleted,
// and release its work: the desktop stayed in stopping for good. Now the record is written
// once Redis answers again, and nothing is deleted.
func TestSleepRecordedThroughARedisBlip(t *testing.T) {
	armed := new(atomic.Bool)
	e := newEnv(t, func(c *Config) {
		c.Guests = armedAfterSaving{Node: c.Guests.(*fakenode.Node), armed: armed}
	})
	e.rdb.AddHook(failDesktopWrite(armed))
	d := e.newDesktop(map[string]any{"name": "blip"})
	e.desktopAction(d.ID, "sleep", 202)
	d = e.waitDesktop(d.ID, desktop.Asleep)
	if armed.Load() {
		t.Fatal("the sleep never read its record after saving the state: the fault was not injected")
	}
	rec, err := e.st.GetDesktop(context.Background(), e.projA, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.MemorySnapshot == "" || rec.DiskSnapshot == "" || !e.snapshotExists(rec.MemorySnapshot) || !e.snapshotExists(rec.DiskSnapshot) {
		t.Errorf("asleep after a Redis blip with memory snapshot %q and disk %q (kept: %v, %v), want both kept",
			rec.MemorySnapshot, rec.DiskSnapshot, e.snapshotExists(rec.MemorySnapshot), e.snapshotExists(rec.DiskSnapshot))
	}
	for _, c := range e.node.Calls() {
		if strings.HasPrefix(c, "delete_snapshot") {
			t.Errorf("the node was asked to %s", c)
		}
	}
}

// failFirstAdmission fails the first write that carries a desktop's session (its admission),
// as a failover would.
func failFirstAdmission(failed *atomic.Bool) processHook {
	return func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if scriptWith(cmd, session.DesktopMetadataKey) && failed.CompareAndSwap(false, true) {
			return resetError(cmd)
		}
		return next(ctx, cmd)
	}
}

// TestStartResumedAfterARedisBlip: a start whose session's admission failed for want of Redis
// once moved the desktop to failed, its state lost; now it leaves its work's lease to run out,
// and the recovery makes the session.
func TestStartResumedAfterARedisBlip(t *testing.T) {
	failed := new(atomic.Bool)
	rdb := redistest.Server(t)
	rdb.AddHook(failFirstAdmission(failed)) // before the store's own clients are made
	e := newEnvOn(t, rdb, func(c *Config) { c.WorkLease = time.Second })
	d := e.newDesktop(map[string]any{"name": "blip"})
	if !failed.Load() {
		t.Fatal("the desktop's admission was never failed: the fault was not injected")
	}
	if d.Message != "" {
		t.Errorf("running with message %q", d.Message)
	}
}

// loseDesktopWrite runs the first write of a desktop record once armed, then answers it with
// a reset: the write is made, its answer lost.
func loseDesktopWrite(armed *atomic.Bool) processHook {
	return func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if scriptWith(cmd, ":d:desk_") && armed.CompareAndSwap(true, false) {
			if err := next(ctx, cmd); err != nil {
				return err
			}
			return resetError(cmd)
		}
		return next(ctx, cmd)
	}
}

// TestSleepWhoseAnswerWasLost: the write of a sleep's end is made but its answer lost; the
// sleep's retry finds the record asleep with its own snapshots, and keeps them (a review found
// a first version deleting them, the desktop's disk with them).
func TestSleepWhoseAnswerWasLost(t *testing.T) {
	armed := new(atomic.Bool)
	e := newEnv(t, func(c *Config) {
		c.Guests = armedAfterSaving{Node: c.Guests.(*fakenode.Node), armed: armed}
	})
	e.rdb.AddHook(loseDesktopWrite(armed))
	d := e.newDesktop(map[string]any{"name": "lost"})
	e.desktopAction(d.ID, "sleep", 202)
	d = e.waitDesktop(d.ID, desktop.Asleep)
	if armed.Load() {
		t.Fatal("the sleep never wrote its record after saving the state: the fault was not injected")
	}
	time.Sleep(3 * time.Second) // the sleep's retry comes 250 ms after the lost answer
	rec, err := e.st.GetDesktop(context.Background(), e.projA, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !e.snapshotExists(rec.MemorySnapshot) || !e.snapshotExists(rec.DiskSnapshot) {
		t.Errorf("asleep after a lost answer with memory snapshot %q (kept: %v) and disk %q (kept: %v)",
			rec.MemorySnapshot, e.snapshotExists(rec.MemorySnapshot), rec.DiskSnapshot, e.snapshotExists(rec.DiskSnapshot))
	}
	for _, c := range e.node.Calls() {
		if strings.HasPrefix(c, "delete_snapshot") {
			t.Errorf("the node was asked to %s", c)
		}
	}
	e.desktopAction(d.ID, "wake", 202)
	if d = e.waitDesktop(d.ID, desktop.Running); d.Message != "" {
		t.Errorf("woke with %q, want its saved state", d.Message)
	}
}

// sendAgain sends the first write of a desktop record naming a session twice, as go-redis
// does after a lost answer.
func sendAgain(done *atomic.Bool) processHook {
	return func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if err == nil && scriptWith(cmd, ":d:desk_") && argHas(cmd, `"session_id":"sess_`) && done.CompareAndSwap(false, true) {
			err = next(ctx, cmd)
		}
		return err
	}
}

// TestStartWhoseWriteWasSentAgain: a start's write of its session's id, sent again, finds the
// id written by its first sending; the start goes on (a review found it giving up, the desktop
// left starting with no work behind it).
func TestStartWhoseWriteWasSentAgain(t *testing.T) {
	done := new(atomic.Bool)
	rdb := redistest.Server(t)
	rdb.AddHook(sendAgain(done))
	e := newEnvOn(t, rdb, func(c *Config) { c.WorkLease = time.Second })
	d := e.newDesktop(map[string]any{"name": "again"})
	if !done.Load() {
		t.Fatal("no write was sent again: the fault was not injected")
	}
	if d.Message != "" {
		t.Errorf("running with %q", d.Message)
	}
}

// failDesktopWritesFor fails every write of a desktop record for d from the first one after
// armed is set, as a Redis away for that long would (its reads go through).
func failDesktopWritesFor(armed *atomic.Bool, d time.Duration) processHook {
	var until atomic.Int64
	return func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if scriptWith(cmd, ":d:desk_") && armed.Load() {
			until.CompareAndSwap(0, time.Now().Add(d).UnixNano())
			if time.Now().UnixNano() < until.Load() {
				return resetError(cmd)
			}
		}
		return next(ctx, cmd)
	}
}

// TestSleepRecordedAfterALongOutage: Redis fails the record of a sleep's end for longer than
// the sleep tries (DesktopRecordFor); the recovery that resumes the sleep once its lease runs
// out records the snapshots the sleep took, found by the names the record gave them. Before,
// it ended the sleep without them: the desktop woke from its previous disk, its state lost,
// and the two snapshots stayed listed in the project, billed and counted.
func TestSleepRecordedAfterALongOutage(t *testing.T) {
	armed := new(atomic.Bool)
	e := newEnv(t, func(c *Config) {
		c.WorkLease = time.Second
		c.DesktopRecordFor = time.Second
		c.Guests = armedAfterSaving{Node: c.Guests.(*fakenode.Node), armed: armed}
	})
	e.rdb.AddHook(failDesktopWritesFor(armed, 4*time.Second))
	d := e.newDesktop(map[string]any{"name": "outage"})
	e.desktopAction(d.ID, "sleep", 202)
	d = e.waitDesktop(d.ID, desktop.Asleep)
	if !armed.Load() {
		t.Fatal("the sleep never saved the state: the fault was not injected")
	}
	rec, err := e.st.GetDesktop(context.Background(), e.projA, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !d.StateSaved || rec.MemorySnapshot == "" || rec.DiskSnapshot == "" || rec.SavingDisk != "" || rec.SavingState != "" {
		t.Errorf("asleep after a long outage: state_saved %v (%q), memory snapshot %q, disk %q, still naming %q and %q; want the sleep's snapshots recorded",
			d.StateSaved, d.Message, rec.MemorySnapshot, rec.DiskSnapshot, rec.SavingDisk, rec.SavingState)
	}
	var list session.List[session.Snapshot]
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &list)
	for _, s := range list.Data {
		if s.ID != rec.DiskSnapshot && s.ID != rec.MemorySnapshot {
			t.Errorf("snapshot %s (memory %v) is listed, and the desktop names it not", s.ID, s.IncludeMemory)
		}
	}
	e.desktopAction(d.ID, "wake", 202)
	if d = e.waitDesktop(d.ID, desktop.Running); d.Message != "" {
		t.Errorf("woke with %q, want its saved state", d.Message)
	}
	if s := e.sessionOf(d.SessionID); s.RestoreFrom == nil || *s.RestoreFrom != rec.MemorySnapshot {
		t.Errorf("woke restored from %v, want the sleep's saved state %s", s.RestoreFrom, rec.MemorySnapshot)
	}
}

// writeAfterSaving calls write once a sleep has saved the state, before the sleep records
// its end.
type writeAfterSaving struct {
	*fakenode.Node
	write func()
}

func (n writeAfterSaving) StopSaving(ctx context.Context, s *session.Session, id string) (hypervisor.SnapshotInfo, error) {
	info, err := n.Node.StopSaving(ctx, s, id)
	n.write()
	return info, err
}

// TestSleepSurvivesAnOlderGatewaysWrite: during a rolling deploy a gateway of an older wb
// writes the record of a desktop going to sleep (a resize, say) without the fields it does
// not know, saving_disk and saving_state among them. The sleep took that for a newer halt's
// and dropped the snapshots it had just taken: the desktop stayed stopping, its disk since
// the last sleep lost. The sleep now records its end, the older write's change kept.
func TestSleepSurvivesAnOlderGatewaysWrite(t *testing.T) {
	var oldWrite func()
	e := newEnv(t, func(c *Config) {
		c.Guests = writeAfterSaving{Node: c.Guests.(*fakenode.Node), write: func() { oldWrite() }}
	})
	ctx := context.Background()
	wrote := new(atomic.Bool)
	d := e.newDesktop(map[string]any{"name": "rolling"})
	id := d.ID
	oldWrite = func() {
		rec, err := e.st.GetDesktop(ctx, e.projA, id)
		if err != nil || rec.SavingDisk == "" {
			t.Errorf("the sleep saved the state before it named its snapshots (%q): %v", rec.SavingDisk, err)
			return
		}
		// What an older gateway's write leaves: the fields it knows, a change of its own.
		rec.SavingDisk, rec.SavingState, rec.From = "", "", ""
		rec.Name = "renamed by an older gateway"
		if _, err := e.st.PutDesktop(ctx, rec, rec.State); err != nil {
			t.Errorf("the older gateway's write: %v", err)
			return
		}
		wrote.Store(true)
	}
	e.desktopAction(id, "sleep", 202)
	d = e.waitDesktop(id, desktop.Asleep)
	if !wrote.Load() {
		t.Fatal("no older gateway wrote the record during the sleep: the fault was not injected")
	}
	rec, err := e.st.GetDesktop(ctx, e.projA, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.StateSaved || rec.MemorySnapshot == "" || rec.DiskSnapshot == "" || !e.snapshotExists(rec.MemorySnapshot) || !e.snapshotExists(rec.DiskSnapshot) {
		t.Errorf("asleep with memory snapshot %q and disk %q (kept: %v, %v), want both kept",
			rec.MemorySnapshot, rec.DiskSnapshot, e.snapshotExists(rec.MemorySnapshot), e.snapshotExists(rec.DiskSnapshot))
	}
	if rec.Name != "renamed by an older gateway" {
		t.Errorf("the older gateway's change was lost: name %q", rec.Name)
	}
	for _, c := range e.node.Calls() {
		if strings.HasPrefix(c, "delete_snapshot") {
			t.Errorf("the node was asked to %s", c)
		}
	}
}
