//go:build linux

package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/hypervisor/oci"
	"wb/internal/fleet"
	"wb/internal/redistest"
	"wb/internal/syncbuf"
)

// mountsOn counts the mounts on dir in this process's mount namespace (the node's, in-process).
func mountsOn(t testing.TB, dir string) int {
	t.Helper()
	n, err := fleet.MountsOn(dir)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNodeStoppedReleasesItsRunDir: a `wb node` stopped with no session's guest left unmounts
// the tmpfs of its runtime state (its data dir's run dir), warm pool or not: its warm guests
// are deleted as it ends. Before, the node asked to unmount before its warm pool was drained,
// found the pool's guests there, and left the tmpfs mounted at every stop.
func TestNodeStoppedReleasesItsRunDir(t *testing.T) {
	tmp, bin := runcGuestDir(t, "wbr")
	dataDir := filepath.Join(tmp, "d")
	const nodeID = "node_rundir"
	t.Cleanup(func() {
		if err := fleet.Reap(context.Background(), "runc", dataDir, nodeID); err != nil {
			t.Logf("wb node's guests: %v", err)
		}
		fleet.UnmountUnder(tmp)
	})
	if err := os.Mkdir(dataDir, 0o755); err != nil { // the guests' user must reach the templates
		t.Fatal(err)
	}
	tokenFile := filepath.Join(tmp, "token")
	if err := os.WriteFile(tokenFile, []byte("wb_node_rundir"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncbuf.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"node", "--redis", "redis://" + redistest.ServerAddr(t), "--token-file", tokenFile, "--id", nodeID,
			"--addr", "127.0.0.1:0", "--runtime", "runc", "--pool", "1", "--run-pool", "0", "--desktop-pool", "0",
			"--data-dir", dataDir, "--agent-bin", filepath.Join(filepath.Dir(bin), "wb-agent")}, io.Discard, logs)
	}()
	stateRoot := oci.RunLayout(dataDir).StateRoot
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("wb node ended: %v\n%s", err, logs.String())
		default:
		}
		if out, _ := exec.Command("runc", "--root", stateRoot, "list", "-q").Output(); len(strings.Fields(string(out))) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("no warm guest of wb node in its run dir's state %s within 3 minutes:\n%s", stateRoot, logs.String())
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wb node: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("wb node did not stop within 2 minutes of its context ending")
	}
	runDir := oci.RunLayout(dataDir).RunDir
	if n := mountsOn(t, runDir); n != 0 {
		out, _ := exec.Command("runc", "--root", stateRoot, "list", "-q").Output()
		t.Errorf("after wb node stopped with no session's guest (guests left: %q): %d mounts on its run dir %s, want none\n%s",
			strings.Fields(string(out)), n, runDir, logs.String())
	}
}

// TestNodeFailedStartReleasesItsRunDir: a `wb node` that fails to start after it opened its
// data dir (here its --agent-bin is no executable) leaves no tmpfs mounted on the run dir.
func TestNodeFailedStartReleasesItsRunDir(t *testing.T) {
	tmp, _ := runcGuestDir(t, "wbr")
	dataDir := filepath.Join(tmp, "d")
	t.Cleanup(func() { fleet.UnmountUnder(tmp) })
	tokenFile := filepath.Join(tmp, "token")
	if err := os.WriteFile(tokenFile, []byte("wb_node_rundir"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := run(ctx, []string{"node", "--redis", "redis://" + redistest.ServerAddr(t), "--token-file", tokenFile, "--id", "node_rundir",
		"--addr", "127.0.0.1:0", "--runtime", "runc", "--pool", "0", "--data-dir", dataDir, "--agent-bin", tokenFile}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--agent-bin") {
		t.Fatalf("wb node with a token file for its agent: %v, want an error naming --agent-bin", err)
	}
	if n := mountsOn(t, oci.RunLayout(dataDir).RunDir); n != 0 {
		t.Errorf("after wb node failed to start: %d mounts on its run dir, want none", n)
	}
}
