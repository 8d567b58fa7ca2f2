package cloudhv_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"wb/agent"
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

// TestFailedMemorySnapshotResumesGuest: a memory snapshot that fails after the driver paused
// the VM (here its dir's "vm" already exists, or its disk copy's file does) answers the error
// with the guest running on, its agent answering, and dir holding none of the snapshot's files.
func TestFailedMemorySnapshotResumesGuest(t *testing.T) {
	for _, tc := range []struct {
		name, there string // there: what dir already holds, which makes the snapshot fail
	}{
		{name: "mkdir", there: "vm"},
		{name: "disk copy", there: "writable.img"}, // after CH wrote dir/vm
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := testCtx(t, 5*time.Minute)
			s := e.spec(newID())
			c := e.boot(t, ctx, s)
			dir := filepath.Join(e.base, "snap")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			there := filepath.Join(dir, tc.there)
			if tc.there == "vm" {
				if err := os.Mkdir(there, 0o700); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(there, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := e.d.Snapshot(ctx, s.ID, dir, true); err == nil {
				t.Fatal("the snapshot succeeded; want it to fail on what dir already holds")
			}
			st, err := e.d.Info(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if st.State != hypervisor.StateRunning {
				t.Errorf("after a failed memory snapshot the guest is %q; want running", st.State)
			}
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := c.Health(hctx); err != nil {
				t.Errorf("after a failed memory snapshot the agent does not answer: %v", err)
			}
			// The egress relay, stopped for the snapshot, serves the guest again.
			if res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "nc -w 5 10.0.0.1 3128 </dev/null"}}, nil); err != nil || res.ExitCode != 0 {
				t.Errorf("after a failed memory snapshot the guest cannot connect to its egress relay: %+v, %v", res, err)
			}
			if _, err := os.Stat(there); err != nil {
				t.Errorf("what dir held before the snapshot: %v", err)
			}
			for _, f := range []string{"snapshot.json", "vm/config.json"} {
				if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the failed snapshot left %s (%v)", f, err)
				}
			}
		})
	}
}
