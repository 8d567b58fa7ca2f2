package fakenode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/session"
	"wb/store"
)

// Node implements placer.Provisioner and gateway.Guests.
type Node struct {
	Store *store.Store
	Info  store.NodeInfo
	Dir   string
	// FailStart makes every provision fail with start_failure.
	FailStart bool
	// Hang makes provisions never report (for deadline tests).
	Hang bool
	// MemorySnapshots: whether snapshots can include memory.
	MemorySnapshots bool

	beat          sync.Mutex // one heartbeat at a time: a change's beat lands after any begun before
	mu            sync.Mutex
	retimeErr     error             // what Retime answers (nil: it applies the timers)
	timers        map[string]Timers // session → the timers the node enforces
	snapshotDelay time.Duration
	badSnapshot   string // a provision restoring this snapshot fails (SetUnrestorable)
	snapshotBytes int64  // what Snapshot answers (0: 4096)
	paused        map[string]bool
	agents        map[string]*fakeAgent
	calls         []string
	touchGate     chan struct{} // while set, Touch waits for it to close (BlockTouches)
}

// New registers a node with generous capacity in region "local".
func New(ctx context.Context, st *store.Store, dir string) (*Node, error) {
	n := &Node{Store: st, Dir: dir, paused: map[string]bool{}, agents: map[string]*fakeAgent{}, timers: map[string]Timers{}, MemorySnapshots: true,
		Info: store.NodeInfo{ID: "node_fake", Addr: "127.0.0.1:0", Region: "local", Zone: "local-a",
			Tiers: []int{1, 2, 3, 4}, VCPU: 1000, MemoryMiB: 1 << 30}}
	return n, n.Heartbeat(ctx)
}

// Heartbeat refreshes the node's registration.
func (n *Node) Heartbeat(ctx context.Context) error {
	n.beat.Lock()
	defer n.beat.Unlock()
	n.mu.Lock()
	info := n.Info
	n.mu.Unlock()
	return n.Store.Heartbeat(ctx, info)
}

// SetCapacity changes the vCPUs the node offers and heartbeats, while other goroutines may
// use the node.
func (n *Node) SetCapacity(ctx context.Context, vcpu int) error {
	n.mu.Lock()
	n.Info.VCPU = vcpu
	n.mu.Unlock()
	return n.Heartbeat(ctx)
}

// SetImages changes the root disk images the node advertises (store.NodeInfo.Images) and
// heartbeats; its memory snapshots from now on need the first.
func (n *Node) SetImages(ctx context.Context, images ...string) error {
	n.mu.Lock()
	n.Info.Images = images
	n.mu.Unlock()
	return n.Heartbeat(ctx)
}

// SetAddr changes the address the node registers and heartbeats, while other goroutines
// may heartbeat: a beat begun before with the old address lands before this one.
func (n *Node) SetAddr(ctx context.Context, addr string) error {
	n.mu.Lock()
	n.Info.Addr = addr
	n.mu.Unlock()
	return n.Heartbeat(ctx)
}

// SetStarts sets FailStart and Hang while other goroutines may use the node.
func (n *Node) SetStarts(fail, hang bool) {
	n.mu.Lock()
	n.FailStart, n.Hang = fail, hang
	n.mu.Unlock()
}

// SetUnrestorable makes provisions that restore snapshot id fail with start_failure, as a
// snapshot that cannot be restored does.
func (n *Node) SetUnrestorable(id string) {
	n.mu.Lock()
	n.badSnapshot = id
	n.mu.Unlock()
}

// SetMemorySnapshots sets MemorySnapshots while other goroutines may use the node.
func (n *Node) SetMemorySnapshots(on bool) {
	n.mu.Lock()
	n.MemorySnapshots = on
	n.mu.Unlock()
}

// Calls lists the operations the node was asked for, as "op:session".
func (n *Node) Calls() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.calls...)
}

func (n *Node) record(op, id string) {
	n.mu.Lock()
	n.calls = append(n.calls, op+":"+id)
	n.mu.Unlock()
}

// Provision starts an in-process agent for the session and reports it running (or failed
// with start_failure).
func (n *Node) Provision(ctx context.Context, _ store.NodeInfo, s *session.Session) error {
	n.record("provision", s.ID)
	n.mu.Lock()
	n.timers[s.ID] = Timers{IdleTimeoutS: s.IdleTimeoutS, MaxLifetimeS: s.MaxLifetimeS}
	hang, fail := n.Hang, n.FailStart
	if s.RestoreFrom != nil && *s.RestoreFrom == n.badSnapshot {
		fail = true
	}
	n.mu.Unlock()
	if hang {
		return nil
	}
	c := store.Change{Project: s.ProjectID, ID: s.ID, From: session.Provisioning, To: session.Running, Driver: session.Node, ColdStart: new(bool)}
	if fail {
		c.To, c.Reason, c.ColdStart = session.Failed, session.StartFailure, nil
	} else if err := n.startAgent(s.ID); err != nil {
		return err
	}
	_, err := n.Store.Transition(ctx, c)
	return err
}

func (n *Node) startAgent(id string) error {
	dir := filepath.Join(n.Dir, id)
	if err := os.MkdirAll(filepath.Join(dir, "workspace"), 0o755); err != nil {
		return err
	}
	sock := filepath.Join(dir, "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = agent.Serve(ctx, agent.Config{Socket: sock, Root: filepath.Join(dir, "workspace")})
	}()
	c := agent.NewClient(sock)
	for i := 0; ; i++ {
		if c.Health(ctx) == nil {
			break
		}
		if i > 500 {
			cancel()
			return errors.New("fakenode: agent never answered")
		}
		time.Sleep(2 * time.Millisecond)
	}
	n.mu.Lock()
	n.agents[id] = &fakeAgent{client: c, stop: func() { cancel(); <-done }}
	n.mu.Unlock()
	return nil
}

type fakeAgent struct {
	client *agent.Client
	stop   func()
}

// Agent answers the session's agent.
func (n *Node) Agent(_ context.Context, s *session.Session) (*agent.Client, error) {
	n.record("agent", s.ID)
	n.mu.Lock()
	defer n.mu.Unlock()
	a, ok := n.agents[s.ID]
	if !ok {
		return nil, fmt.Errorf("fakenode: no agent for %s", s.ID)
	}
	if n.paused[s.ID] {
		return nil, errors.New("guest is paused")
	}
	return a.client, nil
}

// Touch records activity, once BlockTouches lets it.
func (n *Node) Touch(s *session.Session) {
	n.record("touch", s.ID)
	n.mu.Lock()
	gate := n.touchGate
	n.mu.Unlock()
	if gate != nil {
		<-gate
	}
}

// BlockTouches makes every Touch wait until release is called, as a real node's does behind
// a guest's lock held for seconds (a journal write on a busy disk).
func (n *Node) BlockTouches() (release func()) {
	gate := make(chan struct{})
	n.mu.Lock()
	n.touchGate = gate
	n.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			n.touchGate = nil
			n.mu.Unlock()
			close(gate)
		})
	}
}

// Timers are a session's timers as the node enforces them.
type Timers struct{ IdleTimeoutS, MaxLifetimeS int }

// Retime applies new timers, or answers the error SetRetimeError set and keeps the old ones.
func (n *Node) Retime(_ context.Context, s *session.Session) error {
	n.record("retime", s.ID)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.retimeErr != nil {
		return n.retimeErr
	}
	n.timers[s.ID] = Timers{IdleTimeoutS: s.IdleTimeoutS, MaxLifetimeS: s.MaxLifetimeS}
	return nil
}

// SetRetimeError makes every Retime from now on answer err (nil: apply the timers again).
func (n *Node) SetRetimeError(err error) {
	n.mu.Lock()
	n.retimeErr = err
	n.mu.Unlock()
}

// EnforcedTimers answers the timers the node enforces for a session it provisioned.
func (n *Node) EnforcedTimers(sessionID string) (Timers, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t, ok := n.timers[sessionID]
	return t, ok
}

// Exec runs argv through the session's agent.
func (n *Node) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, _ []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	n.record("exec", s.ID)
	c, err := n.Agent(ctx, s)
	if err != nil {
		return session.ExecResult{}, err
	}
	areq, err := agent.ExecRequestFrom(&req)
	if err != nil {
		return session.ExecResult{}, err
	}
	return c.Exec(ctx, areq, out)
}

// Pause marks the guest paused.
func (n *Node) Pause(_ context.Context, s *session.Session) error {
	n.record("pause", s.ID)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.paused[s.ID] = true
	return nil
}

// Resume marks the guest running.
func (n *Node) Resume(_ context.Context, s *session.Session) error {
	n.record("resume", s.ID)
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.paused, s.ID)
	return nil
}

// Snapshot answers a fixed size, after the delay SetSnapshotDelay set. A memory snapshot needs
// the first root disk image the node advertises (Info.Images), where it advertises one.
func (n *Node) Snapshot(ctx context.Context, s *session.Session, id string, mem bool) (hypervisor.SnapshotInfo, error) {
	n.record("snapshot", s.ID)
	n.mu.Lock()
	delay := n.snapshotDelay
	n.mu.Unlock()
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return hypervisor.SnapshotInfo{}, ctx.Err()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	info := hypervisor.SnapshotInfo{Memory: mem && n.MemorySnapshots, SizeBytes: cmp.Or(n.snapshotBytes, 4096)}
	if info.Memory && len(n.Info.Images) > 0 {
		info.RootImage = n.Info.Images[0]
	}
	return info, nil
}

// SetSnapshotDelay makes every snapshot from now on take d, as a real one takes time.
func (n *Node) SetSnapshotDelay(d time.Duration) {
	n.mu.Lock()
	n.snapshotDelay = d
	n.mu.Unlock()
}

// SetSnapshotBytes sets the size every snapshot answers from now on.
func (n *Node) SetSnapshotBytes(b int64) {
	n.mu.Lock()
	n.snapshotBytes = b
	n.mu.Unlock()
}

// DeleteSnapshot records the deletion of a snapshot's files.
func (n *Node) DeleteSnapshot(_ context.Context, id string) error {
	n.record("delete_snapshot", id)
	return nil
}

// Stop ends a stopping session with the terminal state its reason leads to.
func (n *Node) Stop(ctx context.Context, s *session.Session) error {
	n.record("stop", s.ID)
	return n.end(ctx, s)
}

func (n *Node) end(ctx context.Context, s *session.Session) error {
	n.mu.Lock()
	a := n.agents[s.ID]
	delete(n.agents, s.ID)
	n.mu.Unlock()
	if a != nil {
		a.stop()
	}
	cur, err := n.Store.Get(ctx, s.ProjectID, s.ID)
	if err != nil {
		return err
	}
	if cur.State != session.Stopping || cur.StateReason == nil {
		return fmt.Errorf("fakenode: %s is %s, not stopping", s.ID, cur.State)
	}
	_, err = n.Store.Transition(ctx, store.Change{Project: s.ProjectID, ID: s.ID, From: session.Stopping,
		To: cur.StateReason.Terminal(), Driver: session.Node, Reason: *cur.StateReason, Rule: deref(cur.Rule)})
	return err
}

// StopSaving is Stop after a snapshot with memory (when MemorySnapshots) of the size
// SetSnapshotBytes set, taken after the delay SetSnapshotDelay set; it names the node's first
// image (SetImages) as its root disk image, as Snapshot does.
func (n *Node) StopSaving(ctx context.Context, s *session.Session, id string) (hypervisor.SnapshotInfo, error) {
	n.record("stop_saving", s.ID)
	n.mu.Lock()
	info := hypervisor.SnapshotInfo{Memory: n.MemorySnapshots, SizeBytes: cmp.Or(n.snapshotBytes, 4096)}
	if len(n.Info.Images) > 0 {
		info.RootImage = n.Info.Images[0]
	}
	delay := n.snapshotDelay
	n.mu.Unlock()
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return hypervisor.SnapshotInfo{}, ctx.Err()
	}
	if err := n.end(ctx, s); err != nil {
		return hypervisor.SnapshotInfo{}, err
	}
	if !info.Memory {
		return hypervisor.SnapshotInfo{}, nil
	}
	return info, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Close stops every agent.
func (n *Node) Close() {
	n.mu.Lock()
	agents := n.agents
	n.agents = map[string]*fakeAgent{}
	n.mu.Unlock()
	for _, a := range agents {
		a.stop()
	}
}
