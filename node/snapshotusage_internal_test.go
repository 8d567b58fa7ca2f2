package node

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/templates"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// cpuCounters is a driver whose memory snapshots succeed and whose guests' CPU counters the
// test sets; a restored guest's counter starts again at zero, as a new cgroup's does, and its
// agent answers every call.
type cpuCounters struct {
	hypervisor.Driver
	t   *testing.T
	mu  *sync.Mutex
	cpu map[string]int64 // by guest id
}

func (cpuCounters) MemorySnapshots() bool { return true }

func (cpuCounters) Snapshot(context.Context, string, string, bool) (hypervisor.SnapshotInfo, error) {
	return hypervisor.SnapshotInfo{Memory: true}, nil
}

func (d cpuCounters) Restore(_ context.Context, s hypervisor.Spec, _ string) error {
	serveAgreeingAgent(d.t, s.AgentDir)
	d.mu.Lock()
	d.cpu[s.ID] = 0
	d.mu.Unlock()
	return nil
}

func (d cpuCounters) Stats(_ context.Context, id string) (hypervisor.Stats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return hypervisor.Stats{CPUMs: d.cpu[id], MemoryBytes: 1 << 20}, nil
}

func (d cpuCounters) set(id string, ms int64) {
	d.mu.Lock()
	d.cpu[id] = ms
	d.mu.Unlock()
}

func (cpuCounters) Delete(context.Context, string) error { return nil }

func (cpuCounters) Events(context.Context, string) (<-chan hypervisor.Event, error) {
	return nil, errors.New("no events here")
}

// serveAgreeingAgent serves, on the agent socket in dir, an agent that says yes to everything
// (a quiesce, a health probe).
func serveAgreeingAgent(t *testing.T, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Error(err)
		return
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		t.Error(err)
		return
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Connection", "close")
		_, _ = w.Write([]byte(`{"ok":true,"pid":1}`))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// TestMemorySnapshotBillsBothGuestsCPU: a memory snapshot replaces the guest with one restored
// from its checkpoint. The CPU the old guest used since its last sample is billed before the
// checkpoint stops it (it was lost with the old guest), and the restored guest's counter,
// which starts again at zero, is billed from zero (the old guest's counter was subtracted from
// it).
func TestMemorySnapshotBillsBothGuestsCPU(t *testing.T) {
	d := cpuCounters{t: t, mu: &sync.Mutex{}, cpu: map[string]int64{}}
	const old = "g_old"
	n, l := snapshotNode(t, d, nil, "sess_cpu", "proj_cpu", old, 10_000)
	d.set(old, 12_000) // 2 s of CPU since the last sample, then the checkpoint
	info, err := n.takeSnapshot(context.Background(), &session.Session{ID: "sess_cpu", ProjectID: "proj_cpu"}, "snap_0123456789abcdefgh", true)
	mem := info.Memory
	if err != nil || !mem {
		t.Fatalf("snapshot: memory %v, %v", mem, err)
	}
	l.mu.Lock() // held by the restore until the new guest is back
	defer l.mu.Unlock()
	if l.g.GuestID == old {
		t.Fatal("the snapshot did not replace the guest")
	}
	billedBothGuests(t, n, l, d)
}

// billedBothGuests samples l's new guest at 15 s of CPU and checks that its session, billed
// 10 s before its snapshot, was billed the old guest's 2 s since (its counter at 12 s) and
// the new guest's 15 s, each once: in all and in the usage records since the snapshot began.
func billedBothGuests(t *testing.T, n *Node, l *live, d cpuCounters) {
	t.Helper()
	d.set(l.g.GuestID, 15_000)
	n.sampleWith(l, func(id string) (hypervisor.Stats, error) { return d.Stats(context.Background(), id) })
	var recorded int64
	for _, p := range l.g.Pending {
		if p.Usage != nil {
			recorded += p.Usage.CPUMs
		}
	}
	if got, want := l.g.CPUMs, int64(10_000+2_000+15_000); got != want {
		t.Errorf("CPU billed in all: %d ms, want %d ms", got, want)
	}
	if want := int64(2_000 + 15_000); recorded != want {
		t.Errorf("usage records since the snapshot began: %d ms of CPU, want %d ms", recorded, want)
	}
}

// snapshotNode is a node on driver d (m its metrics, or nil) with one running guest, guestID,
// of session sessionID in project, whose agent agrees to a quiesce, its CPU sampled 3 s ago
// at cpu ms: what the memory snapshot tests take.
func snapshotNode(t *testing.T, d hypervisor.Driver, m *Metrics, sessionID, project, guestID string, cpu int64) (*Node, *live) {
	t.Helper()
	n, err := New(Config{Store: store.New(redistest.Server(t)), Driver: d, Templates: templates.Catalog{"tpl": {}},
		DataDir: shortTempDir(t), Logger: slog.New(slog.DiscardHandler), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	close(n.recovered)
	serveAgreeingAgent(t, filepath.Join(n.guestDir(guestID), "agent"))
	now := time.Now()
	l := &live{agent: n.agentFor(guestID), g: &guest{SessionID: sessionID, Project: project, GuestID: guestID,
		State: session.Running, Template: "tpl", Tier: 2, StartedAt: now.Add(-time.Minute), SampledAt: now.Add(-3 * time.Second),
		IdleTimeoutS: 600, MaxLifetimeS: 3600, CPURaw: cpu, CPUMs: cpu}}
	n.guests[sessionID] = l
	return n, l
}
