package cloudhv_test

import (
	"path/filepath"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
)

// TestSnapshotRestore: a disk-only snapshot leaves the guest running and a memory snapshot
// stops it; either restores into a new guest (a new VMM) that has the file written in
// /workspace before the snapshot.
func TestSnapshotRestore(t *testing.T) {
	for _, memory := range []bool{false, true} {
		name := "disk"
		if memory {
			name = "memory"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ctx := testCtx(t, 5*time.Minute)
			s := e.spec(newID())
			c := e.boot(t, ctx, s)
			sh(t, ctx, c, "echo kept > /workspace/f")
			dir := filepath.Join(e.base, "snap")
			info, err := e.d.Snapshot(ctx, s.ID, dir, memory)
			if err != nil {
				t.Fatal(err)
			}
			if info.Memory != memory || info.SizeBytes <= 0 {
				t.Errorf("SnapshotInfo = %+v; want memory %v and a size", info, memory)
			}
			st, err := e.d.Info(ctx, s.ID)
			switch {
			case err != nil:
				t.Fatal(err)
			case memory && st.State != hypervisor.StateStopped:
				t.Errorf("after a memory snapshot the guest is %s; want stopped (the caller restores)", st.State)
			case !memory && st.State != hypervisor.StateRunning:
				t.Errorf("after a disk snapshot the guest is %s; want running", st.State)
			case !memory:
				sh(t, ctx, c, "echo after > /workspace/g")
			}
			r := e.spec(newID())
			if err := e.d.Restore(ctx, r, dir); err != nil {
				t.Fatal(err)
			}
			rc := e.agentOf(r.ID)
			defer rc.Close()
			waitHealthy(t, ctx, rc, 2*time.Minute)
			if got := sh(t, ctx, rc, "cat /workspace/f; ls /workspace"); got != "kept\nf\n" {
				t.Errorf("restored guest's /workspace: %q; want f alone, holding kept", got)
			}
			if st, err := e.d.Info(ctx, r.ID); err != nil || st.State != hypervisor.StateRunning {
				t.Errorf("restored guest: %+v, %v", st, err)
			}
			if !cloudhv.ConsoleRelayed(e.d, r.ID) {
				t.Error("the restored guest's console is not copied")
			}
		})
	}
}
