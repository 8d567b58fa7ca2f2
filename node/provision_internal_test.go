package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/templates"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// agentDriver launches each guest as an agent serving in this process on the guest's agent
// socket; stats answers its counters.
type agentDriver struct {
	hypervisor.Driver
	ctx   context.Context
	wg    *sync.WaitGroup
	stats func(ctx context.Context, id string) (hypervisor.Stats, error)
}

func (d agentDriver) Launch(_ context.Context, s hypervisor.Spec) error {
	d.wg.Go(func() {
		_ = agent.Serve(d.ctx, agent.Config{Socket: filepath.Join(s.AgentDir, s.AgentSocket), Root: filepath.Join(s.AgentDir, "root")})
	})
	return nil
}

func (d agentDriver) Stats(ctx context.Context, id string) (hypervisor.Stats, error) {
	return d.stats(ctx, id)
}

func (agentDriver) Events(ctx context.Context, _ string) (<-chan hypervisor.Event, error) {
	ch := make(chan hypervisor.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}

func (agentDriver) KnownRunning(string) (bool, bool)                { return false, false }
func (agentDriver) Stop(context.Context, string) error              { return nil }
func (agentDriver) Delete(context.Context, string) error            { return nil }
func (agentDriver) OOMKills(context.Context, string) (int64, error) { return 0, nil }

// agentNode is a node, recovered and not running its loops, whose guests are agentDriver's
// with stats.
func agentNode(t *testing.T, stats func(ctx context.Context, id string) (hypervisor.Stats, error)) *Node {
	t.Helper()
	dir, err := os.MkdirTemp("", "wbp") // t.TempDir's is too long for the guests' sockets
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	n, err := New(Config{Store: store.New(redistest.Server(t)), Driver: agentDriver{ctx: ctx, wg: &wg, stats: stats},
		Templates: templates.Catalog{"tpl": {Name: "tpl"}}, DataDir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	close(n.recovered)
	t.Cleanup(func() {
		for _, l := range n.all() {
			l.mu.Lock()
			l.stopEgress()
			if l.cancel != nil {
				l.cancel()
			}
			l.mu.Unlock()
		}
		n.cancel()
		cancel()
		wg.Wait()
		_ = os.RemoveAll(dir)
	})
	return n
}

func provisioned(id string) *session.Session {
	return &session.Session{ID: id, ProjectID: "proj_prov", Tier: 2, Template: "tpl", State: session.Provisioning,
		Resources: session.Resources{SizeClass: "custom", VCPU: 1, MemoryMiB: 512, DiskGiB: 1}, IdleTimeoutS: 600, MaxLifetimeS: 600}
}

// TestProvisionBaselinesTheGuestItStarted: Provision reads the CPU baseline of its guest
// after the session is reported running, and a memory snapshot may replace the guest by
// then. It reads the guest's id under the guest's lock (go test -race flagged the read) and
// takes no baseline from the old guest's counter for the new one, whose counter starts at 0:
// else the new guest's CPU up to the old one's count went unbilled.
func TestProvisionBaselinesTheGuestItStarted(t *testing.T) {
	replaced := make(chan struct{})
	var n *Node
	n = agentNode(t, func(ctx context.Context, id string) (hypervisor.Stats, error) {
		if id == "sess_prov_replaced" { // the started guest: its baseline waits for the replacement
			select {
			case <-replaced:
			case <-ctx.Done():
			}
			return hypervisor.Stats{CPUMs: 5000}, nil
		}
		return hypervisor.Stats{}, nil
	})
	const id = "sess_prov_replaced"
	go func() {
		// Once the session runs and its transition is flushed, a memory snapshot replaces the
		// guest, as restoreGuest does.
		defer close(replaced)
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			n.mu.Lock()
			l := n.guests[id]
			n.mu.Unlock()
			if l == nil {
				continue
			}
			l.mu.Lock()
			if l.g.State == session.Running && len(l.g.Pending) == 0 {
				l.g.GuestID, l.g.CPURaw = "g-restored", 0
				l.mu.Unlock()
				return
			}
			l.mu.Unlock()
		}
	}()
	if err := n.Provision(t.Context(), n.Info, provisioned(id)); err != nil {
		t.Fatal(err)
	}
	l, err := n.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.g.GuestID != "g-restored" || l.g.CPURaw != 0 {
		t.Errorf("after the guest was replaced, the CPU baseline of %s is %d, want 0 (5000 is the replaced guest's counter)",
			l.g.GuestID, l.g.CPURaw)
	}
}

// TestProvisionKeepsASampledZeroBaseline: a sample taken while Provision reads the CPU
// baseline stands, even when the guest's counter read 0 then: Provision's reading, taken
// later, would leave the CPU used in between unbilled. (A counter of 0 meant "no baseline".)
func TestProvisionKeepsASampledZeroBaseline(t *testing.T) {
	var counter atomic.Int64
	asked, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	n := agentNode(t, func(ctx context.Context, id string) (hypervisor.Stats, error) {
		if !first.Swap(true) { // Provision's baseline read, slow (a runtime call on runsc)
			close(asked)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return hypervisor.Stats{CPUMs: counter.Load()}, nil
	})
	const id = "sess_prov_zero"
	done := make(chan error, 1)
	go func() { done <- n.Provision(t.Context(), n.Info, provisioned(id)) }()
	select {
	case <-asked:
	case err := <-done:
		t.Fatalf("Provision answered %v without reading the baseline", err)
	}
	time.Sleep(5 * time.Millisecond) // an interval to sample
	n.flushUsage(t.Context())        // reads the counter at 0
	counter.Store(300)               // the guest runs
	close(release)                   // Provision's reading: 300
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	n.flushUsage(t.Context())
	l, err := n.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.g.CPUMs != 300 {
		t.Errorf("billed %d ms of CPU, want the 300 ms the guest used after the sample that read its counter at 0", l.g.CPUMs)
	}
}

// TestRunsFirstActivityWritesNoJournal: the start's journal entry counts the next
// activitySaved as active (as a touch's does), so that a run's exec, which comes within
// milliseconds of its session's start, does not write the guest's journal again (a file
// replaced by rename, about 0.5 ms of CPU here, one of a run's six). A node restarted
// after that exec still finds the guest active at least until it: late by at most
// activitySaved, never early.
func TestRunsFirstActivityWritesNoJournal(t *testing.T) {
	n := agentNode(t, func(context.Context, string) (hypervisor.Stats, error) { return hypervisor.Stats{}, nil })
	start := time.Now()
	var offset atomic.Int64 // the test's clock: the node's time is start plus offset
	n.Now = func() time.Time { return start.Add(time.Duration(offset.Load())) }
	var writes atomic.Int64
	n.journal.write = func(path string, b []byte) error { writes.Add(1); return writeReplacing(path, b) }
	const id = "sess_first_touch"
	if err := n.Provision(t.Context(), n.Info, provisioned(id)); err != nil {
		t.Fatal(err)
	}
	offset.Store(int64(50 * time.Millisecond)) // the run's exec, 50 ms after the start
	before := writes.Load()
	n.Touch(&session.Session{ID: id, ProjectID: "proj_prov"})
	if got := writes.Load() - before; got != 0 {
		t.Errorf("the first activity, 50 ms after the start, wrote the journal %d times, want none", got)
	}
	var g guest
	b, err := os.ReadFile(n.journal.path(id))
	if err != nil || json.Unmarshal(b, &g) != nil {
		t.Fatalf("journal of %s: %s, %v", id, b, err)
	}
	touched := start.Add(50 * time.Millisecond)
	last := g.LastActivity // as a restart finds it (recover)
	if g.ActivityUntil.After(last) {
		last = g.ActivityUntil
	}
	if last.Before(touched) || last.After(touched.Add(activitySaved)) {
		t.Errorf("a restart would find the last activity at %s, want from the touch (%s) to %s after it", last, touched, activitySaved)
	}
}
