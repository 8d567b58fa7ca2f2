package node_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/session"
)

// TestGoneGuestsDirsGo: a node restarted after a session's guest was destroyed while no node
// ran (the run dir's guests that a node on the disk layout reaps, oci.OpenDataDir; a host's
// reboot) fails the session and removes the guest's dir under <data dir>/guests, which
// nothing else did; so goes a dir of a guest that neither the journal nor the driver knows
// (an older node's, whose journal let go of its failed session), disk image and all. The dir
// of a session's guest that runs on stays, and so does one with a mount below it (a guest's
// disk or agent dir: something uses it still).
func TestGoneGuestsDirsGo(t *testing.T) {
	const project = "proj_gonedirs"
	st, _ := newStore(t)
	a, d, reopen := restartableNode(t, st, "runc", "node_gonedirs")
	lost := provision(t, st, a.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	kept := provision(t, st, a.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	a.stop(t)
	ctx := ctxT(t, time.Minute)
	if err := d.Stop(ctx, lost.ID); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, lost.ID); err != nil {
		t.Fatal(err)
	}
	guests := filepath.Join(a.DataDir, "guests")
	orphan := filepath.Join(guests, "tgone"+randHex(t, 4))
	if err := os.MkdirAll(filepath.Join(orphan, "writable"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan, "writable.img"), []byte("a disk image"), 0o600); err != nil {
		t.Fatal(err)
	}
	busy := filepath.Join(guests, "tbusy"+randHex(t, 4))
	if err := os.MkdirAll(filepath.Join(busy, "agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", filepath.Join(busy, "agent"), "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(filepath.Join(busy, "agent"), syscall.MNT_DETACH) })
	left, _ := os.ReadDir(filepath.Join(guests, lost.ID))
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	t.Logf("the lost guest's dir before the restart holds %q", names)

	_, cfg := reopen()
	startNode(t, cfg)
	end, _ := waitState(t, st, project, lost.ID, time.Minute, session.Failed, session.Stopped, session.Expired)
	checkEnded(t, end, session.Failed, session.HostFailure)
	for _, p := range []string{filepath.Join(guests, lost.ID), orphan} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("after the node's restart the dir of a guest that is gone is left: %s", p)
		}
	}
	for _, p := range []string{filepath.Join(guests, kept.ID), busy} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("after the node's restart a dir in use is gone: %v", err)
		}
	}
	if info, err := d.Info(ctx, kept.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Errorf("the session's guest that ran on: %+v, %v", info, err)
	}
}
