package node

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/hypervisor"
	"wb/hypervisor/templates"
	"wb/internal/redistest"
	"wb/quota"
	"wb/session"
	"wb/store"
)

// countersOnly is a driver that answers only Stats (a usage flush reads nothing else).
type countersOnly struct{ hypervisor.Driver }

func (countersOnly) Stats(context.Context, string) (hypervisor.Stats, error) {
	return hypervisor.Stats{CPUMs: 10, MemoryBytes: 1 << 20}, nil
}

// gatedWrites is a journal write that announces each write on started and waits for release
// before it writes.
type gatedWrites struct {
	started chan struct{}
	release chan struct{}
}

func (g gatedWrites) write(path string, b []byte) error {
	g.started <- struct{}{}
	<-g.release
	return writeReplacing(path, b)
}

// open lets every write through from now on; stop ends the announcements' reader.
func (g gatedWrites) open() (stop func()) {
	go func() {
		for range g.started {
		}
	}()
	close(g.release)
	return func() { close(g.started) }
}

// TestUsageFlushWritesTheJournalUnlocked: the usage flush writes the guest's journal entry
// without holding the guest's lock (a cold make test's writes took up to 4.4 s on a saturated
// disk, and the timers, which skip a guest whose lock is held, fired 5 s late), and sends
// Redis the usage record only once the entry that holds it has landed.
func TestUsageFlushWritesTheJournalUnlocked(t *testing.T) {
	dir, err := os.MkdirTemp("", "wbj")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	rdb := redistest.Server(t)
	n, err := New(Config{Store: store.New(rdb), Driver: countersOnly{}, Templates: templates.Catalog{"tpl": {}}, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	gate := gatedWrites{started: make(chan struct{}), release: make(chan struct{})}
	n.journal.write = gate.write
	const project, id = "proj_journal", "sess_journal"
	now := time.Now()
	l := &live{g: &guest{SessionID: id, Project: project, GuestID: "g_journal", State: session.Running, Tier: 2,
		StartedAt: now.Add(-time.Minute), SampledAt: now.Add(-time.Second), IdleTimeoutS: 600, MaxLifetimeS: 600}}
	n.guests[id] = l

	done := make(chan struct{})
	go func() { defer close(done); n.flushUsage(context.Background()) }()
	select {
	case <-gate.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the usage flush wrote no journal entry")
	}
	if !l.mu.TryLock() {
		t.Fatal("the usage flush holds the guest's lock while it writes the journal")
	}
	l.mu.Unlock()
	usage := store.ProjectKeys(project).UsageStream()
	if got := rdb.XLen(context.Background(), usage).Val(); got != 0 {
		t.Fatalf("Redis has %d usage records before the journal entry holding them landed", got)
	}
	stop := gate.open() // the flush's own write, once Redis took the record, goes through too
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the usage flush did not end")
	}
	stop()
	if got := rdb.XLen(context.Background(), usage).Val(); got != 1 {
		t.Fatalf("Redis has %d usage records after the flush, want 1", got)
	}
	var saved guest
	b, err := os.ReadFile(n.journal.path(id))
	if err != nil || json.Unmarshal(b, &saved) != nil || len(saved.Pending) != 0 {
		t.Fatalf("the journal after the flush: %s (%v); want the entry with nothing pending", b, err)
	}

	// Any flush writes ahead, not only the usage flush's own: a sample whose entry was taken
	// but not yet written (its writer let go of the lock and has not written it) is written
	// by the flush that finds it, before Redis gets it.
	gate = gatedWrites{started: make(chan struct{}), release: make(chan struct{})}
	n.journal.write = gate.write
	l.mu.Lock()
	l.g.SampledAt = time.Now().Add(-time.Second)
	n.sampleWith(l, func(string) (hypervisor.Stats, error) { return hypervisor.Stats{CPUMs: 20, MemoryBytes: 1 << 20}, nil })
	_ = n.saveLater(l) // its writer is slow to write it
	l.mu.Unlock()
	flushed := make(chan bool, 1)
	go func() { flushed <- n.flush(context.Background(), l) }()
	select {
	case <-gate.started:
	case ok := <-flushed:
		t.Fatalf("the flush ended (%v) without writing the journal entry that holds its record", ok)
	case <-time.After(30 * time.Second):
		t.Fatal("the flush wrote no journal entry")
	}
	if got := rdb.XLen(context.Background(), usage).Val(); got != 1 {
		t.Fatalf("Redis has %d usage records before the journal entry holding the second landed, want 1", got)
	}
	stop = gate.open()
	if ok := <-flushed; !ok {
		t.Fatal("the second flush failed")
	}
	stop()
	if got := rdb.XLen(context.Background(), usage).Val(); got != 2 {
		t.Fatalf("Redis has %d usage records after the second flush, want 2", got)
	}
}

// TestAFailedJournalWriteHoldsTheFlush: a journal write that fails (a full disk) holds the
// guest's pending changes back from Redis, so Redis never holds a usage record the journal
// lacks (a restarted node would number its next interval with that record's seq, and the
// settler drop it as a replay). The changes stay pending, and the first flush after the
// journal writes again sends them, each seq once and none missing. The failure is logged at
// error level once for the streak, not once a flush.
func TestAFailedJournalWriteHoldsTheFlush(t *testing.T) {
	dir, err := os.MkdirTemp("", "wbj")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	rdb := redistest.Server(t)
	n, err := New(Config{Store: store.New(rdb), Driver: countersOnly{}, Templates: templates.Catalog{"tpl": {}},
		DataDir: dir, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	const project, id = "proj_full", "sess_full"
	now := time.Now()
	l := &live{g: &guest{SessionID: id, Project: project, GuestID: "g_full", State: session.Running, Tier: 2,
		StartedAt: now.Add(-time.Minute), SampledAt: now.Add(-2 * time.Second), IdleTimeoutS: 600, MaxLifetimeS: 600}}
	n.guests[id] = l
	interval := func() {
		t.Helper()
		l.mu.Lock()
		l.g.SampledAt = time.Now().Add(-2 * time.Second) // a fresh interval to sample
		l.mu.Unlock()
		n.flushUsage(context.Background())
	}
	sent := func() []int64 {
		t.Helper()
		msgs, err := rdb.XRange(context.Background(), store.ProjectKeys(project).UsageStream(), "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		var seqs []int64
		for _, m := range msgs {
			r, err := quota.DecodeRecord(m.Values)
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, r.Seq)
		}
		return seqs
	}
	journaledSeq := func() int64 {
		t.Helper()
		var g guest
		b, err := os.ReadFile(n.journal.path(id))
		if err != nil || json.Unmarshal(b, &g) != nil {
			t.Fatalf("journal of %s: %s, %v", id, b, err)
		}
		return g.Seq
	}

	n.flushUsage(context.Background()) // seq 1: the journal and Redis agree
	if got := sent(); len(got) != 1 || journaledSeq() != 1 {
		t.Fatalf("after the first flush Redis has seqs %v and the journal seq %d; want [1] and 1", got, journaledSeq())
	}

	n.journal.write = func(string, []byte) error { return &os.PathError{Op: "write", Err: syscall.ENOSPC} }
	interval() // seq 2
	interval() // seq 3
	if got, last := sent(), journaledSeq(); len(got) != 1 || last != 1 {
		t.Fatalf("with the journal failing, Redis has seqs %v and the journal's last seq is %d: a restarted node "+
			"numbers its next interval %d again (the settler drops it as a replay)", got, last, last+1)
	}
	l.mu.Lock()
	held := len(l.g.Pending)
	l.mu.Unlock()
	if held != 2 {
		t.Fatalf("%d changes pending while the journal fails, want the 2 usage records held back", held)
	}
	mu.Lock()
	failures := strings.Count(logs.String(), "level=ERROR")
	mu.Unlock()
	if failures != 1 {
		t.Errorf("%d error lines for a streak of failed journal writes, want 1:\n%s", failures, logs.String())
	}

	n.journal.write = nil // the disk has room again
	interval()            // seq 4, with the two held back
	got, last := sent(), journaledSeq()
	if want := []int64{1, 2, 3, 4}; !slices.Equal(got, want) || last != 4 {
		t.Fatalf("once the journal writes again, Redis has seqs %v and the journal seq %d; want %v and 4", got, last, want)
	}
	l.mu.Lock()
	held = len(l.g.Pending)
	l.mu.Unlock()
	if held != 0 {
		t.Errorf("%d changes still pending after the journal wrote again, want 0", held)
	}
}

// TestJournalWritesLandInOrder: a write taken before a newer entry landed writes nothing, and
// none lands after the entry was removed.
func TestJournalWritesLandInOrder(t *testing.T) {
	n := &Node{Config: Config{Logger: slog.New(slog.DiscardHandler)}, journal: journal{dir: t.TempDir()}}
	l := &live{g: &guest{SessionID: "sess_order", State: session.Running}}
	read := func() session.State {
		t.Helper()
		var g guest
		b, err := os.ReadFile(n.journal.path("sess_order"))
		if err != nil || json.Unmarshal(b, &g) != nil {
			t.Fatalf("journal: %s, %v", b, err)
		}
		return g.State
	}
	older := n.saveLater(l)
	l.g.State = session.Paused
	n.save(l)
	older()
	if got := read(); got != session.Paused {
		t.Fatalf("an older entry's write replaced the newer one: %s", got)
	}
	var wg sync.WaitGroup
	late := n.saveLater(l)
	n.forgetJournal(l, "sess_order")
	wg.Go(late)
	wg.Wait()
	if _, err := os.Stat(n.journal.path("sess_order")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a write taken before the entry was removed brought it back: %v", err)
	}
}

// TestTimersLogABusyGuest: the timers skip a guest whose lock an operation holds; when one
// of its timers came due meanwhile and the wait lasted a second or more, they say so, naming
// the guest (a cold make test's idle stop came 5 s late and nothing in the log said why). A
// wait with no timer due (a provision's) is not worth a line. The line names the operation.
func TestTimersLogABusyGuest(t *testing.T) {
	dir, err := os.MkdirTemp("", "wbt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	n, err := New(Config{Store: store.New(redistest.Server(t)), Driver: countersOnly{}, Templates: templates.Catalog{"tpl": {}},
		DataDir: dir, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for _, c := range []struct {
		id       string
		started  time.Duration // before t0
		wantLine bool
	}{
		{"sess_busy_due", 85 * time.Second, true}, // its idle warning (at 80 s) is due
		{"sess_busy_quiet", 10 * time.Second, false},
	} {
		l := &live{g: &guest{SessionID: c.id, Project: "proj_busy", GuestID: "g_" + c.id, State: session.Running, Tier: 2,
			StartedAt: t0.Add(-c.started), SampledAt: t0, IdleTimeoutS: 100, MaxLifetimeS: 3600}}
		n.mu.Lock()
		n.guests = map[string]*live{c.id: l}
		n.mu.Unlock()
		op := lockFor(l, "snapshot") // an operation under way
		n.timers(context.Background(), t0)
		op.unlock()
		n.timers(context.Background(), t0.Add(1500*time.Millisecond))
		mu.Lock()
		got := regexp.MustCompile(`msg="node: a guest's timers waited for an operation on it" session=` + c.id + ` .* operation=snapshot`).MatchString(logs.String())
		mu.Unlock()
		if got != c.wantLine {
			t.Errorf("%s: a line for a 1.5 s wait: %v, want %v", c.id, got, c.wantLine)
		}
	}
	n.cancel()
	n.windDown()
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// lifecycle is a driver that answers Stats and records the guests it was asked to stop;
// pause, resume and delete succeed.
type lifecycle struct {
	countersOnly
	stopped chan string
}

func (d lifecycle) Stop(_ context.Context, id string) error {
	d.stopped <- id
	return nil
}
func (lifecycle) Pause(context.Context, string) error  { return nil }
func (lifecycle) Resume(context.Context, string) error { return nil }
func (lifecycle) Delete(context.Context, string) error { return nil }

// idleNode is a node of cfg whose Run is not called (it has no journal to reload), with a data
// dir and a template of its own; its background work is waited for when the test ends.
func idleNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	dir, err := os.MkdirTemp("", "wbg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg.DataDir, cfg.Templates, cfg.Logger = dir, templates.Catalog{"tpl": {}}, slog.New(slog.DiscardHandler)
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.cancel(); n.windDown() })
	close(n.recovered)
	return n
}

// gatedNode is a node over lifecycle whose journal writes wait for the test (gatedWrites)
// until it calls open, which the test's end does too (the node's background work, which it
// waits for, may be waiting for a write).
func gatedNode(t *testing.T) (n *Node, d lifecycle, started <-chan struct{}, open func()) {
	t.Helper()
	d = lifecycle{stopped: make(chan string, 4)}
	gate := gatedWrites{started: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	stop := func() {}
	open = func() { once.Do(func() { stop = gate.open() }) }
	t.Cleanup(func() { stop() })
	n = idleNode(t, Config{Store: store.New(redistest.Server(t)), Driver: d})
	n.journal.write = gate.write
	t.Cleanup(open)
	return n, d, gate.started, open
}

func journaled(t *testing.T, n *Node, id string) session.State {
	t.Helper()
	var g guest
	b, err := os.ReadFile(n.journal.path(id))
	if err != nil || json.Unmarshal(b, &g) != nil {
		t.Fatalf("journal of %s: %s, %v", id, b, err)
	}
	return g.State
}

// TestTimersDoNotWaitForTheJournal: the timers, which serve every guest of the node in turn,
// take a stop's or a warning's journal entry without writing it (the flush and the teardown
// write it), so a disk that holds a write for seconds does not hold every other guest's
// timers as long; and the teardown kills the guest only once the stopping entry has landed.
func TestTimersDoNotWaitForTheJournal(t *testing.T) {
	n, d, started, open := gatedNode(t)
	now := time.Now()
	for id, started := range map[string]time.Duration{
		"sess_idle_out": 200 * time.Second, // idle for longer than its 100 s
		"sess_warned":   85 * time.Second,  // its idle warning (at 80 s) is due
	} {
		n.guests[id] = &live{g: &guest{SessionID: id, Project: "proj_timers", GuestID: "g_" + id, State: session.Running, Tier: 2,
			StartedAt: now.Add(-started), SampledAt: now, IdleTimeoutS: 100, MaxLifetimeS: 3600}}
	}
	done := make(chan struct{})
	go func() { defer close(done); n.timers(context.Background(), now) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the timers waited for a journal write")
	}
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("nothing wrote the journal entries the timers took")
	}
	select {
	case id := <-d.stopped:
		t.Fatalf("%s was killed before its stopping entry landed", id)
	case <-time.After(500 * time.Millisecond):
	}
	open()
	select {
	case id := <-d.stopped:
		if id != "g_sess_idle_out" {
			t.Fatalf("stopped %s, want g_sess_idle_out", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the idle guest was never torn down")
	}
	n.windDown() // the flushes and the teardown have written
	if got := journaled(t, n, "sess_warned"); got != session.Running {
		t.Fatalf("the warned guest's journal says %s", got)
	}
}

// TestOperationsWriteTheJournalUnlocked: a pause writes its journal entry after it let go of
// the guest's lock (the timers skip a guest whose lock is held) but before it answers; and a
// resume right after is journaled too (it was not when the guest had been active within the
// last second: a node restarted then would have thought the running guest paused).
func TestOperationsWriteTheJournalUnlocked(t *testing.T) {
	n, _, started, open := gatedNode(t)
	const id = "sess_op"
	now := time.Now()
	l := &live{g: &guest{SessionID: id, Project: "proj_op", GuestID: "g_op", State: session.Running, Tier: 2,
		StartedAt: now, SampledAt: now, IdleTimeoutS: 600, MaxLifetimeS: 3600}}
	n.guests[id] = l
	s := &session.Session{ID: id, ProjectID: "proj_op"}
	paused := make(chan error, 1)
	go func() { paused <- n.Pause(context.Background(), s) }()
	select {
	case <-started:
	case err := <-paused:
		t.Fatalf("the pause answered (%v) before its journal entry was written", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the pause wrote no journal entry")
	}
	if !l.mu.TryLock() {
		t.Fatal("the pause holds the guest's lock while it writes the journal")
	}
	l.mu.Unlock()
	select {
	case err := <-paused:
		t.Fatalf("the pause answered (%v) before its journal entry landed", err)
	case <-time.After(200 * time.Millisecond):
	}
	open()
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if got := journaled(t, n, id); got != session.Paused {
		t.Fatalf("the journal after the pause says %s", got)
	}

	l.mu.Lock()
	l.g.ActivityUntil = time.Now().Add(time.Minute) // active just before the pause
	l.mu.Unlock()
	if err := n.Resume(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if got := journaled(t, n, id); got != session.Running {
		t.Fatalf("the journal after the resume says %s", got)
	}
}

// memorySnapshots is a driver that takes memory snapshots; it records each checkpoint.
type memorySnapshots struct {
	countersOnly
	checkpoints chan string
}

func (memorySnapshots) MemorySnapshots() bool { return true }

func (d memorySnapshots) Snapshot(_ context.Context, id, _ string, _ bool) (hypervisor.SnapshotInfo, error) {
	d.checkpoints <- id
	return hypervisor.SnapshotInfo{}, errors.New("no checkpoint here")
}

// TestSnapshotBoundsTheQuiesce: an agent that never answers the quiesce that comes before a
// memory snapshot fails the snapshot in quiesceAnswer, and frees the guest's lock, which the
// snapshot holds (a cold make test's desktop snapshot waited 18 minutes for an answer, and
// every flush, replay and reconcile of the node waited behind it); the resume file is made,
// for an agent that did quiesce, and no checkpoint is taken.
func TestSnapshotBoundsTheQuiesce(t *testing.T) {
	dir, err := os.MkdirTemp("", "wbq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	d := memorySnapshots{checkpoints: make(chan string, 1)}
	n, err := New(Config{Store: store.New(redistest.Server(t)), Driver: d, Templates: templates.Catalog{"tpl": {}}, DataDir: dir,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	close(n.recovered)
	n.quiesceAnswer = 300 * time.Millisecond
	const guestID = "g_mute"
	sock := filepath.Join(n.guestDir(guestID), "agent", "agent.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an agent that reads the request and never answers
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	now := time.Now()
	l := &live{agent: n.agentFor(guestID), g: &guest{SessionID: "sess_mute", Project: "proj_mute", GuestID: guestID,
		State: session.Running, Template: "tpl", Tier: 2, StartedAt: now, SampledAt: now, IdleTimeoutS: 600, MaxLifetimeS: 3600}}
	n.guests["sess_mute"] = l
	const snap = "snap_0123456789abcdefgh"
	done := make(chan error, 1)
	go func() {
		_, err := n.takeSnapshot(context.Background(), &session.Session{ID: "sess_mute", ProjectID: "proj_mute"}, snap, true)
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the snapshot still waits for the agent's answer to its quiesce")
	}
	if err == nil || !strings.Contains(err.Error(), "the agent did not quiesce") {
		t.Fatalf("snapshot: %v, want the quiesce's failure", err)
	}
	if !l.mu.TryLock() {
		t.Fatal("the failed snapshot kept the guest's lock")
	}
	l.mu.Unlock()
	if _, err := os.Stat(filepath.Join(n.guestDir(guestID), "agent", resumeFile(snap))); err != nil {
		t.Fatalf("no resume file after the failed quiesce: %v", err)
	}
	select {
	case id := <-d.checkpoints:
		t.Fatalf("%s was checkpointed though its agent never quiesced", id)
	default:
	}
}

// statsCounting is lifecycle whose counters count their reads: 500 ms of CPU and 1 GiB.
type statsCounting struct {
	lifecycle
	reads *atomic.Int64
}

func (d statsCounting) Stats(context.Context, string) (hypervisor.Stats, error) {
	d.reads.Add(1)
	return hypervisor.Stats{CPUMs: 500, MemoryBytes: 1 << 30}, nil
}

// TestEndLeavesTheCountersToTheFinalMeter: a stop that the timers make (end, on the loop that
// serves every guest in turn) reads no counters, whose read took seconds on a loaded host;
// the teardown's final meter reads them once, and bills the memory of the whole span since
// the last read.
func TestEndLeavesTheCountersToTheFinalMeter(t *testing.T) {
	rdb := redistest.Server(t)
	d := statsCounting{lifecycle: lifecycle{stopped: make(chan string, 4)}, reads: new(atomic.Int64)}
	// The node's clock stands still: the final meter comes within the stop's millisecond,
	// as it can on a quick host, and must read the counters all the same.
	now := time.Now()
	n := idleNode(t, Config{Store: store.New(rdb), Driver: d, Now: func() time.Time { return now }})
	const project, id = "proj_end", "sess_end"
	l := &live{g: &guest{SessionID: id, Project: project, GuestID: "g_end", State: session.Running, Tier: 2,
		StartedAt: now.Add(-time.Minute), SampledAt: now.Add(-10 * time.Second), IdleTimeoutS: 600, MaxLifetimeS: 600}}
	n.guests[id] = l
	l.mu.Lock()
	n.end(context.Background(), l, session.Timer, session.IdleTimeout, "")
	reads := d.reads.Load()
	l.mu.Unlock()
	if reads != 0 {
		t.Errorf("end read the guest's counters %d times", reads)
	}
	select {
	case <-d.stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the guest was never torn down")
	}
	n.windDown() // the teardown's flush has sent the records
	if got := d.reads.Load(); got != 1 {
		t.Errorf("the counters were read %d times by the stop, want once (the final meter)", got)
	}
	msgs, err := rdb.XRange(context.Background(), store.ProjectKeys(project).UsageStream(), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var cpu, mem int64
	for _, m := range msgs {
		r, err := quota.DecodeRecord(m.Values)
		if err != nil {
			t.Fatal(err)
		}
		cpu, mem = cpu+r.CPUMs, mem+r.MemGiBMs
	}
	if cpu != 500 || mem < 10_000 || mem > 70_000 {
		t.Errorf("records bill %d ms of CPU and %d GiB·ms; want 500 and 1 GiB over the 10 s and more since the last read", cpu, mem)
	}
}

// TestReplayDuringAnOutageWritesNoJournal: while Redis does not answer, each replay round
// probes a guest's pending changes and applies none: the journal, which holds them already,
// is not written again (each round rewrote the probed guest's entry).
func TestReplayDuringAnOutageWritesNoJournal(t *testing.T) {
	away := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { away.Close() })
	var writes atomic.Int32
	n := &Node{Config: Config{Logger: slog.New(slog.DiscardHandler), Store: store.New(away), RedisTimeout: time.Second},
		journal: journal{dir: t.TempDir()}, guests: map[string]*live{}}
	n.journal.write = func(path string, b []byte) error {
		writes.Add(1)
		return writeReplacing(path, b)
	}
	l := &live{g: &guest{SessionID: "sess_away", Project: "proj_away", State: session.Running,
		Pending: []pending{{Kind: "warning", Event: session.EventIdleWarning, At: time.Now()}}}}
	n.guests["sess_away"] = l
	n.save(l)
	before := writes.Load()
	for range 3 {
		n.replay(t.Context())
	}
	if got := writes.Load() - before; got != 0 {
		t.Errorf("3 replay rounds with Redis away wrote the journal %d times, want 0", got)
	}
	if len(l.g.Pending) != 1 || !n.redisDown.Load() {
		t.Errorf("after the rounds: %d changes pending, Redis down %v; want 1, true", len(l.g.Pending), n.redisDown.Load())
	}
}

// TestReplayWhileTheJournalFailsProbesOneGuest: while journal writes fail, every guest's
// changes wait pending, and each replay round (one a Tick, 100 ms) probes the journal with one
// guest instead of rewriting every guest's entry, as it does while Redis is down.
func TestReplayWhileTheJournalFailsProbesOneGuest(t *testing.T) {
	n := &Node{Config: Config{Logger: slog.New(slog.DiscardHandler), Store: store.New(redistest.Server(t)), RedisTimeout: time.Second},
		journal: journal{dir: t.TempDir()}, guests: map[string]*live{}}
	var writes atomic.Int32
	n.journal.write = func(string, []byte) error {
		writes.Add(1)
		return &os.PathError{Op: "write", Err: syscall.ENOSPC}
	}
	for _, id := range []string{"sess_full_a", "sess_full_b"} {
		l := &live{g: &guest{SessionID: id, Project: "proj_full", State: session.Running,
			Pending: []pending{{Kind: "warning", Event: session.EventIdleWarning, At: time.Now()}}}}
		n.guests[id] = l
		n.save(l) // fails: the entry holding the warning has not landed
	}
	before := writes.Load()
	for range 3 {
		n.replay(t.Context())
	}
	if got := writes.Load() - before; got != 3 {
		t.Errorf("3 replay rounds with the journal failing tried %d writes, want 3 (one guest a round)", got)
	}
	for id, l := range n.guests {
		if len(l.g.Pending) != 1 {
			t.Errorf("%s: %d changes pending after the rounds, want the warning held back", id, len(l.g.Pending))
		}
	}

	n.journal.write = nil // the disk has room again
	n.replay(t.Context())
	for id, l := range n.guests {
		if len(l.g.Pending) != 0 {
			t.Errorf("%s: %d changes pending once the journal writes again, want 0", id, len(l.g.Pending))
		}
	}
}

// TestReconcilePassesABusyGuest: reconcile does not wait for the lock of a guest that an
// operation holds (a restore holds it a minute or two): another guest, whose session ended
// elsewhere, is destroyed meanwhile, and the busy one is looked at in a later round. Before,
// reconcile waited at the busy guest's lock, and every guest's with it.
func TestReconcilePassesABusyGuest(t *testing.T) {
	st := store.New(redistest.Server(t))
	d := lifecycle{stopped: make(chan string, 4)}
	n := idleNode(t, Config{Store: st, Driver: d})
	const project = "proj_reconcile"
	ctx := t.Context()
	for _, id := range []string{"sess_busy", "sess_ended"} {
		s := &session.Session{ID: id, ProjectID: project, Tier: 2, State: session.Pending, Template: "tpl",
			CreatedAt: *session.At(time.Now())}
		if _, err := st.Create(ctx, s, 10); err != nil {
			t.Fatal(err)
		}
		n.guests[id] = &live{g: &guest{SessionID: id, Project: project, GuestID: "g_" + id, State: session.Running, Tier: 2,
			StartedAt: time.Now(), SampledAt: time.Now(), IdleTimeoutS: 600, MaxLifetimeS: 600}}
	}
	if _, err := st.Transition(ctx, store.Change{Project: project, ID: "sess_ended", From: session.Pending, To: session.Stopped,
		Driver: session.Caller, Reason: session.Deleted}); err != nil {
		t.Fatal(err)
	}
	busy := lockFor(n.guests["sess_busy"], "restore")
	defer busy.unlock()
	done := make(chan struct{})
	go func() {
		n.reconcile(ctx)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("reconcile waited 30 s for a busy guest's lock")
	}
	select {
	case id := <-d.stopped:
		if id != "g_sess_ended" {
			t.Errorf("reconcile stopped guest %s, want g_sess_ended", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the guest of a session that ended elsewhere was not stopped while another guest was busy")
	}
}

// deafChecker is a runtime decision point that answers nothing until release is closed,
// whatever its context.
type deafChecker struct{ release chan struct{} }

func (c deafChecker) Check(context.Context, RuntimeSession, session.GuestEvent) (Verdict, error) {
	<-c.release
	return Verdict{}, nil
}

// TestHungDecisionsAreBounded: a decision deaf to its context is given up on at the bound,
// and goes on unwaited for; once maxDecisions such are under way, the next event is refused
// at once rather than leave one more behind. When they end, decisions are made again.
func TestHungDecisionsAreBounded(t *testing.T) {
	deaf := deafChecker{release: make(chan struct{})}
	n := &Node{Config: Config{Runtime: deaf}}
	ev := session.GuestEvent{Type: session.GuestExec, Argv: []string{"true"}}
	for i := range maxDecisions {
		if _, err := n.decide(t.Context(), RuntimeSession{}, ev, time.Millisecond); err == nil {
			close(deaf.release)
			t.Fatalf("decision %d of a deaf decision point answered", i)
		}
	}
	start := time.Now()
	_, err := n.decide(t.Context(), RuntimeSession{}, ev, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "under way already") || time.Since(start) > 10*time.Second {
		close(deaf.release)
		t.Fatalf("with %d decisions hung, the next: %v after %s; want a refusal at once", maxDecisions, err, time.Since(start))
	}
	close(deaf.release)
	for deadline := time.Now().Add(30 * time.Second); n.decisions.Load() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d decisions still counted 30 s after they ended", n.decisions.Load())
		}
	}
	n.Runtime = allowAllChecker{}
	if _, err := n.decide(t.Context(), RuntimeSession{}, ev, time.Minute); err != nil {
		t.Fatalf("a decision once the hung ones ended: %v", err)
	}
}

type allowAllChecker struct{}

func (allowAllChecker) Check(context.Context, RuntimeSession, session.GuestEvent) (Verdict, error) {
	return Verdict{}, nil
}

// clockCounters is a driver whose guests' CPU counters run at a quarter of clock's time since
// start (a usage flush reads nothing but Stats).
type clockCounters struct {
	hypervisor.Driver
	clock *atomic.Int64 // unix ms
	start int64
}

func (d clockCounters) Stats(context.Context, string) (hypervisor.Stats, error) {
	return hypervisor.Stats{CPUMs: (d.clock.Load() - d.start) / 4, MemoryBytes: 1 << 30}, nil
}

// TestHeldUsageIsBoundedWhileTheJournalFails: while journal writes fail, the flush holds each
// guest's usage back (TestAFailedJournalWriteHoldsTheFlush), and the samples of a long
// failure extend the newest record held rather than add one every flush period: the guests
// hold one record each however long it lasts, and once the journal writes again the settled
// totals are exactly what was metered, under contiguous seqs.
func TestHeldUsageIsBoundedWhileTheJournalFails(t *testing.T) {
	heldUsageIsBounded(t, 200, 1, []int64{1, 2}, func(n *Node, live *store.Store) (fail, heal func()) {
		return func() {
				n.journal.write = func(string, []byte) error { return &os.PathError{Op: "write", Err: syscall.ENOSPC} }
			}, func() {
				n.journal.write = nil // the disk has room again
			}
	})
}

// TestHeldUsageIsBoundedWhileRedisIsAway: so too while Redis does not answer, except for the
// record each guest's flush tried (it may have reached Redis, and is never changed): two
// records a guest.
func TestHeldUsageIsBoundedWhileRedisIsAway(t *testing.T) {
	away := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 50 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { away.Close() })
	heldUsageIsBounded(t, 40, 2, []int64{1, 2, 3}, func(n *Node, live *store.Store) (fail, heal func()) {
		n.RedisTimeout = 100 * time.Millisecond
		return func() { n.Store = store.New(away) }, func() { n.Store = live }
	})
}

// heldUsageIsBounded meters three guests for rounds flush periods of a fault (fault's fail
// and heal), and wants each to hold held records at the end of it, and Redis to have
// seqs of each after it, with the settled totals what was metered.
func heldUsageIsBounded(t *testing.T, rounds, held int, seqs []int64, fault func(n *Node, live *store.Store) (fail, heal func())) {
	rdb := redistest.Server(t)
	start := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	var clock atomic.Int64
	clock.Store(start.UnixMilli())
	dir, err := os.MkdirTemp("", "wbj") // t.TempDir's is too long for the guests' sockets
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	n, err := New(Config{Store: store.New(rdb), Driver: clockCounters{clock: &clock, start: start.UnixMilli()},
		Templates: templates.Catalog{"tpl": {}}, DataDir: dir, Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return time.UnixMilli(clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	fail, heal := fault(n, n.Store)
	const project = "proj_held"
	ids := []string{"sess_held_a", "sess_held_b", "sess_held_c"}
	for _, id := range ids {
		l := &live{g: &guest{SessionID: id, Project: project, GuestID: "g_" + id, State: session.Running, Tier: 2,
			Resources: session.Resources{SizeClass: "small", VCPU: 1, MemoryMiB: 1024}, StartedAt: start, SampledAt: start,
			IdleTimeoutS: 86400, MaxLifetimeS: 86400}, egress: &egressProxy{}}
		n.guests[id] = l
	}
	var egress int64
	round := func() {
		clock.Add(4000)
		for _, id := range ids {
			n.guests[id].egress.bytes.Add(1000)
		}
		egress += 1000
		n.flushUsage(t.Context())
	}
	holding := func() (total int) {
		for _, id := range ids {
			l := n.guests[id]
			l.mu.Lock()
			total += len(l.g.Pending)
			l.mu.Unlock()
		}
		return total
	}

	round() // seq 1 of each, sent
	fail()
	for range rounds {
		round()
		n.replay(t.Context()) // a replay round that fails changes nothing
	}
	if got := holding(); got != held*len(ids) {
		t.Fatalf("after %d flush periods of the fault, %d guests hold %d usage records; want %d each", rounds, len(ids), got, held)
	}

	heal()
	round()
	if got := holding(); got != 0 {
		t.Fatalf("%d records still held once the fault ended", got)
	}
	msgs, err := rdb.XRange(t.Context(), store.ProjectKeys(project).UsageStream(), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]int64{}
	for _, m := range msgs {
		r, err := quota.DecodeRecord(m.Values)
		if err != nil {
			t.Fatal(err)
		}
		got[r.SessionID] = append(got[r.SessionID], r.Seq)
	}
	settler := quota.NewSettler(rdb, quota.SettlerOptions{Consumer: "test", Logger: slog.New(slog.DiscardHandler)})
	if _, err := settler.SettleProject(t.Context(), project); err != nil {
		t.Fatal(err)
	}
	elapsed := clock.Load() - start.UnixMilli()
	hour, err := rdb.HGetAll(t.Context(), store.ProjectKeys(project).UsageHour(start)).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if !slices.Equal(got[id], seqs) {
			t.Errorf("%s: Redis has seqs %v, want %v", id, got[id], seqs)
		}
		for field, want := range map[string]int64{"session_ms": elapsed, "cpu_ms": elapsed / 4, "egress_bytes": egress,
			"mem_gib_ms": elapsed} {
			if got := hour["s:"+id+":"+field]; got != strconv.FormatInt(want, 10) {
				t.Errorf("%s: settled %s %s, want %d (metered)", id, field, got, want)
			}
		}
	}
}
