package node_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/session"
	"wb/store"
)

// TestCloseRemovesCgroupParent: a node that closes with no guest left removes its driver's
// cgroup parent; one that still runs a session's guest keeps it (the guest lives on for the
// node's next start). Before, every node that ever ran on a host left its empty parent in
// every controller: a hundred after one cold make test.
func TestCloseRemovesCgroupParent(t *testing.T) {
	t.Parallel()
	const project = "proj_cgroup_parent"
	st, _ := newStore(t)
	d := newDriver(t, "runc", tempDir(t))
	n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_cgroup_parent"))
	parent := strings.TrimSuffix(d.CgroupPath(""), "/")
	// The controllers' directories of the parent that exist (cgroup v1: one per controller;
	// v2: the unified one).
	dirs := func() []string {
		var out []string
		for _, ctrl := range []string{"", "memory", "pids", "cpu", "freezer"} {
			if dir := filepath.Join("/sys/fs/cgroup", ctrl, parent); statOK(dir) {
				out = append(out, dir)
			}
		}
		return out
	}
	s := provision(t, st, n.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	n.Close(ctxT(t, time.Minute))
	if len(dirs()) == 0 {
		t.Fatalf("a node closed with a session's guest running removed its cgroup parent %s", parent)
	}
	s, err := st.Transition(ctxT(t, 10*time.Second), store.Change{Project: project, ID: s.ID, From: session.Running,
		To: session.Stopping, Driver: session.Caller, Reason: session.Deleted})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Stop(ctxT(t, 2*time.Minute), s); err != nil {
		t.Fatal(err)
	}
	if err := waitGuestGone(t, d, s.ID, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	n.stop(t)
	n.Close(ctxT(t, time.Minute))
	if left := dirs(); len(left) > 0 {
		t.Fatalf("a node closed with no guest left kept its cgroup parent: %v", left)
	}
}

func statOK(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
