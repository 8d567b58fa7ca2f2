// Package fakenode is an in-memory node for tests of the control plane (placer, gateway,
// webhooks) before real guests are involved. It runs commands on the host in a temporary
// directory per session, with no isolation at all; `wb serve` never uses it.
package fakenode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

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

	mu     sync.Mutex
	paused map[string]bool
	calls  []string
}

// New registers a node with generous capacity in region "local".
func New(ctx context.Context, st *store.Store, dir string) (*Node, error) {
	n := &Node{Store: st, Dir: dir, paused: map[string]bool{}, MemorySnapshots: true,
		Info: store.NodeInfo{ID: "node_fake", Addr: "127.0.0.1:0", Region: "local", Zone: "local-a",
			Tiers: []int{1, 2, 3, 4}, VCPU: 1000, MemoryMiB: 1 << 30}}
	return n, n.Heartbeat(ctx)
}

// Heartbeat refreshes the node's registration.
func (n *Node) Heartbeat(ctx context.Context) error { return n.Store.Heartbeat(ctx, n.Info) }

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

// Provision reports the session running (or failed with start_failure).
func (n *Node) Provision(ctx context.Context, _ store.NodeInfo, s *session.Session) error {
	n.record("provision", s.ID)
	if n.Hang {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(n.Dir, s.ID), 0o755); err != nil {
		return err
	}
	c := store.Change{Project: s.ProjectID, ID: s.ID, From: session.Provisioning, To: session.Running, Driver: session.Node, ColdStart: new(bool)}
	if n.FailStart {
		c.To, c.Reason, c.ColdStart = session.Failed, session.StartFailure, nil
	}
	_, err := n.Store.Transition(ctx, c)
	return err
}

// Exec runs argv on the host in the session's directory.
func (n *Node) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, argv []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	n.record("exec", s.ID)
	n.mu.Lock()
	paused := n.paused[s.ID]
	n.mu.Unlock()
	if paused {
		return session.ExecResult{}, errors.New("guest is paused")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.Timeout())*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = filepath.Join(n.Dir, s.ID)
	if req.Cwd != "" {
		cmd.Dir = filepath.Join(cmd.Dir, req.Cwd)
	}
	for k, v := range req.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewBufferString(req.Stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	res := session.ExecResult{Stdout: stdout.String(), Stderr: stderr.String(), DurationMs: time.Since(start).Milliseconds()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		res.TimedOut, res.ExitCode = true, 124
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	case err != nil:
		res.ExitCode, res.Stderr = 127, err.Error()
	}
	if out != nil {
		for _, c := range []session.ExecChunk{{Stream: "stdout", Data: res.Stdout}, {Stream: "stderr", Data: res.Stderr}} {
			if c.Data != "" {
				if err := out(c); err != nil {
					return res, err
				}
			}
		}
	}
	return res, nil
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

// Snapshot answers a fixed size.
func (n *Node) Snapshot(_ context.Context, s *session.Session, id string, mem bool) (bool, int64, error) {
	n.record("snapshot", s.ID)
	return mem && n.MemorySnapshots, 4096, nil
}

// Stop ends a stopping session with the terminal state its reason leads to.
func (n *Node) Stop(ctx context.Context, s *session.Session) error {
	n.record("stop", s.ID)
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

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
