package node_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/session"
)

// slowEvents is a driver whose Events answers only once release is closed: a runtime whose
// first look at a guest (runc state, a process) is slow on a loaded host.
type slowEvents struct {
	timedDriver
	release chan struct{}
}

func (d slowEvents) Events(ctx context.Context, id string) (<-chan hypervisor.Event, error) {
	select {
	case <-d.release:
	case <-ctx.Done():
	}
	return d.timedDriver.Events(ctx, id)
}

// TestFirstExecNotHeldByWatch: a session's first exec (a run's only one) runs as soon as the
// session runs; it does not wait for the event watch's first look at the guest.
func TestFirstExecNotHeldByWatch(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	d := newDriver(t, "runc", tempDir(t))
	cfg := nodeConfig(t, st, d, tempDir(t), "node_watch")
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	cfg.Driver = slowEvents{timedDriver{d, cfg.Logger}, release}
	n := startNode(t, cfg)
	s := placed(t, st, "proj_watch", n.Info.ID, sessionOpts{idleS: 600, lifeS: 600})
	provisioned := make(chan error, 1)
	go func() { provisioned <- n.Provision(context.Background(), n.Info, s) }()
	got, _ := waitState(t, st, "proj_watch", s.ID, 2*time.Minute, session.Running, session.Failed)
	if got.State != session.Running {
		free()
		t.Fatalf("the session is %s", got.State)
	}
	type result struct {
		res session.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := execIn(ctxT(t, time.Minute), n.Node, got, "echo hi")
		done <- result{res, err}
	}()
	select {
	case r := <-done:
		free()
		if r.err != nil || r.res.Stdout != "hi\n" {
			t.Fatalf("the first exec answered %+v, %v", r.res, r.err)
		}
	case <-time.After(30 * time.Second):
		free()
		<-done
		t.Fatal("the first exec waited for the event watch's first look at the guest")
	}
	if err := <-provisioned; err != nil {
		t.Fatal(err)
	}
}
