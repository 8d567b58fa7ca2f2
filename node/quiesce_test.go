package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/session"
)

// slowCheckpoint is a driver whose snapshots begin late, as runsc's do on a loaded host.
type slowCheckpoint struct {
	testDriver
	delay time.Duration
}

func (d slowCheckpoint) Snapshot(ctx context.Context, id, dir string, memory bool) (hypervisor.SnapshotInfo, error) {
	time.Sleep(d.delay)
	return d.testDriver.Snapshot(ctx, id, dir, memory)
}

// TestSlowCheckpointKeepsTheGuest: a runsc memory snapshot whose checkpoint begins seconds
// after the agent let go of its socket still succeeds, and the session goes on with its
// process: the agent stays off until the node says (its resume file), not for a window the
// checkpoint can miss (a window of 1 s, then 4 s, lost that race and stopped the guest).
func TestSlowCheckpointKeepsTheGuest(t *testing.T) {
	t.Parallel()
	const project = "proj_slowckpt"
	st, _, n := runscNode(t, "node_slowckpt", func(d testDriver) hypervisor.Driver { return slowCheckpoint{d, 6 * time.Second} })
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 600, lifeS: 1200})
	ctx := ctxT(t, 5*time.Minute)
	if res, err := execIn(ctx, n.Node, s, "sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > /workspace/bg.pid; echo kept > /workspace/f"); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	info, err := n.Snapshot(ctx, s, session.NewID("snap_", time.Now()), true)
	mem := info.Memory
	if err != nil || !mem {
		t.Fatalf("a slow checkpoint: memory %v, %v", mem, err)
	}
	res, err := execIn(ctx, n.Node, s, `cat /workspace/f; tr '\0' ' ' < /proc/$(cat /workspace/bg.pid)/cmdline`)
	if err != nil || !strings.HasPrefix(res.Stdout, "kept\n") || !strings.Contains(res.Stdout, "sleep 3600") {
		t.Fatalf("after the snapshot: %+v, %v", res, err)
	}
}
