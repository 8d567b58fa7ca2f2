package agent_test

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/wbbin"
)

// TestVMModeInRuncGuest runs `wb agent --vsock-port 1024` as PID 1 of a runc guest with
// WB_VSOCK_UNIX_DIR set, as the test VMM does: the agent serves on DIR/1024.sock, and its VM
// setup leaves the runtime's mounts alone (the workspace is still the host's writable dir).
func TestVMModeInRuncGuest(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (runc)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("needs runc")
	}
	if testing.Short() {
		t.Skip("builds wb and starts a runc guest")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a cold build of wb, a busy machine
	defer cancel()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil { // runc's guest root is an unprivileged host uid
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	wb, err := wbbin.Agent(dir)
	if err != nil {
		t.Fatal(err)
	}
	cat, err := templates.AssembleWith(filepath.Join(dir, "tpl"), templates.Options{HostRoot: filepath.Join(dir, "nohost")})
	if err != nil {
		t.Fatal(err)
	}
	var console strings.Builder
	d, err := oci.New(oci.Options{
		Runtime:      oci.RuntimeRunc,
		StateRoot:    filepath.Join(dir, "state"),
		BundleRoot:   filepath.Join(dir, "bundles"),
		CgroupParent: "/wbtest-vm-" + rand.Text()[:8],
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.RemoveCgroupParent() })
	tpl := cat[templates.Base]
	s := hypervisor.Spec{
		ID:          "vm" + rand.Text()[:10],
		RootFS:      tpl.RootFS,
		Writable:    filepath.Join(dir, "writable"),
		AgentDir:    filepath.Join(dir, "agent"),
		AgentBin:    wb,
		AgentSocket: "1024.sock",
		Args:        []string{hypervisor.GuestAgentBin, "agent", "--vsock-port", "1024", "--log-level", "debug"},
		Env:         append(tpl.Env, agent.VsockUnixDirEnv+"="+hypervisor.GuestAgentDir),
		VCPU:        1,
		MemoryMiB:   256,
		DiskGiB:     1,
		Pids:        128,
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Stop(ctx, s.ID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			t.Logf("stop: %v", err)
		}
		if b, err := os.ReadFile(d.ConsoleLog(s.ID)); err == nil {
			console.Write(b)
		}
		if err := d.Delete(ctx, s.ID); err != nil {
			t.Logf("delete: %v", err)
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("guest console:\n%s", console.String())
		}
	})
	if err := d.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := d.Boot(ctx, s.ID); err != nil { // waits for the agent's socket
		t.Fatal(err)
	}
	c := agent.NewClient(agent.VsockUnixSocket(s.AgentDir, 1024))
	defer c.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		hctx, hcancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.Health(hctx)
		hcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not healthy over %s: %v", agent.VsockUnixSocket(s.AgentDir, 1024), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo hi > /workspace/f && hostname && echo \"[$" + agent.VsockUnixDirEnv + "]\""}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Stdout != "wb-guest\n[]\n" {
		t.Errorf("exec: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(hypervisor.WorkspaceDir(s.Writable), "f")); err != nil || string(b) != "hi\n" {
		t.Errorf("the guest's /workspace is not the host's writable dir any more: %q, %v", b, err)
	}
}
