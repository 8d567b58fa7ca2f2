package node_test

import (
	"context"
	"errors"
	"strings"
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

// lateExits is a driver whose guests' exit events reach the node exitDelay late: a loaded
// host, on which the runtime takes seconds to report a guest's death.
type lateExits struct {
	timedDriver
}

const exitDelay = 4 * time.Second

func (d lateExits) Events(ctx context.Context, id string) (<-chan hypervisor.Event, error) {
	in, err := d.timedDriver.Events(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make(chan hypervisor.Event)
	go func() {
		defer close(out)
		for ev := range in {
			if ev.Type == hypervisor.EventExit {
				select {
				case <-time.After(exitDelay):
				case <-ctx.Done():
					return
				}
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// TestExecNamesALateCrash: an exec whose guest crashes under it names guest_crash even when
// the runtime reports the death seconds late (it once gave up after two), and an exec that
// breaks while its guest lives does not wait for a verdict that will not come.
func TestExecNamesALateCrash(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	d := newDriver(t, "runc", tempDir(t))
	cfg := nodeConfig(t, st, d, tempDir(t), "node_latecrash")
	cfg.Driver = lateExits{timedDriver{d, cfg.Logger}}
	n := startNode(t, cfg)
	s := provision(t, st, n.Node, "proj_latecrash", sessionOpts{idleS: 300, lifeS: 600})

	// The exec's output callback fails: the answer breaks while the guest lives.
	t0 := time.Now()
	_, err := n.Exec(ctxT(t, 30*time.Second), s, execReq("echo hi; sleep 5"), nil, func(session.ExecChunk) error {
		return errors.New("the caller went away")
	})
	if err == nil || strings.Contains(err.Error(), "reason") {
		t.Fatalf("an exec whose caller went away: %v", err)
	}
	if took := time.Since(t0); took > exitDelay {
		t.Errorf("an exec broken while its guest lives answered after %s: it waited for a guest death", took)
	}

	_, err = execIn(ctxT(t, time.Minute), n.Node, s, "kill -TERM 1; sleep 10")
	if err == nil || !strings.Contains(err.Error(), "reason guest_crash") {
		t.Fatalf("the exec whose guest crashed, reported %s late: %v; want the error to name guest_crash", exitDelay, err)
	}
}
