package cloudhv_test

import (
	"context"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
)

// TestRestartedDriverFindsGuest: a new driver on the same state dir (a restarted node) lists
// the running guest, reports it running, copies its console again, reaches its agent, and
// sees its exit.
func TestRestartedDriverFindsGuest(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 5*time.Minute)
	s := e.spec(newID())
	c := e.boot(t, ctx, s)
	sh(t, ctx, c, "echo before > /workspace/f")
	if !cloudhv.ConsoleRelayed(e.d, s.ID) {
		t.Error("the booted guest's console is not copied")
	}

	d2, err := cloudhv.New(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if !cloudhv.ConsoleRelayed(d2, s.ID) {
		t.Error("the new driver does not copy the guest's console")
	}
	if ids, err := d2.List(ctx); err != nil || len(ids) != 1 || ids[0] != s.ID {
		t.Fatalf("List after restart = %v, %v", ids, err)
	}
	if info, err := d2.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("Info after restart = %+v, %v", info, err)
	}
	events, err := d2.Events(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	c2 := e.agentOfDriver(d2, s.ID)
	defer c2.Close()
	if got := sh(t, ctx, c2, "cat /workspace/f"); got != "before\n" {
		t.Errorf("through the new driver: %q", got)
	}
	if err := d2.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		if ev.Type != hypervisor.EventExit {
			t.Fatalf("event %+v; want exit", ev)
		}
	case <-time.After(time.Minute):
		t.Fatal("the new driver saw no exit")
	}
}
