package image_test

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
	"wb/hypervisor/cloudhv/image"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/wbbin"
)

// TestRootFSImageRunsAgent: the rootfs image RootFSImage makes from tpl_base and a real static
// wb, loop-mounted read-only as a runc guest's root (as the test VMM runs a VM's disks), runs
// its own /run/wb-bin/wb as `agent --vsock-port 1024`, which answers on the vsock stand-in.
func TestRootFSImageRunsAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (loop mount, runc)")
	}
	for _, tool := range []string{"runc", "mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	if testing.Short() {
		t.Skip("builds wb and starts a runc guest")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a cold build of wb
	defer cancel()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // runc's guest root is an unprivileged host uid
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	wb, err := wbbin.Agent(dir)
	if err != nil {
		t.Fatal(err)
	}
	cat, err := templates.AssembleWith(filepath.Join(dir, "tpl"), templates.Options{HostRoot: filepath.Join(dir, "nohost")})
	if err != nil {
		t.Fatal(err)
	}
	img, err := image.RootFSImage(ctx, filepath.Join(dir, "cache"), cat[templates.Base].RootFS, wb)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, "mount", "-o", "loop,ro", img, root).CombinedOutput(); err != nil {
		t.Skipf("cannot loop-mount: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", root).Run() })

	d, err := oci.New(oci.Options{
		Runtime:      oci.RuntimeRunc,
		StateRoot:    filepath.Join(dir, "state"),
		BundleRoot:   filepath.Join(dir, "bundles"),
		CgroupParent: "/wbtest-img-" + rand.Text()[:8],
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.RemoveCgroupParent() })
	s := hypervisor.Spec{
		ID:          "img" + rand.Text()[:10],
		RootFS:      root,
		Writable:    filepath.Join(dir, "writable"),
		AgentDir:    filepath.Join(dir, "agent"),
		AgentSocket: "1024.sock",
		// No AgentBin: the image's own binary runs.
		Args:      []string{hypervisor.GuestAgentBin, "agent", "--vsock-port", "1024"},
		Env:       append(cat[templates.Base].Env, agent.VsockUnixDirEnv+"="+hypervisor.GuestAgentDir),
		VCPU:      1,
		MemoryMiB: 256,
		DiskGiB:   1,
		Pids:      128,
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Stop(ctx, s.ID); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			t.Logf("stop: %v", err)
		}
		if t.Failed() {
			b, _ := os.ReadFile(d.ConsoleLog(s.ID))
			t.Logf("guest console:\n%s", b)
		}
		if err := d.Delete(ctx, s.ID); err != nil {
			t.Logf("delete: %v", err)
		}
	})
	if err := d.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := d.Boot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	c := agent.NewClient(agent.VsockUnixSocket(s.AgentDir, image.AgentVsockPort))
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
			t.Fatalf("the image's agent is not healthy: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// PID 1 is /sbin/init, the agent binary, running the agent. (Its /proc/1/exe is closed to
	// the guest's processes where they lack CAP_SYS_PTRACE: the agent is not dumpable.)
	res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "readlink /sbin/init && tr '\\0' ' ' </proc/1/cmdline"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	link, cmdline, _ := strings.Cut(res.Stdout, "\n")
	argv := strings.Fields(cmdline)
	if res.ExitCode != 0 || link != hypervisor.GuestAgentBin || len(argv) < 2 ||
		(argv[0] != "/sbin/init" && argv[0] != hypervisor.GuestAgentBin) || argv[1] != "agent" {
		t.Errorf("in the guest: exit %d stdout %q stderr %q; want /sbin/init → %s, and PID 1 that binary's agent", res.ExitCode, res.Stdout, res.Stderr, hypervisor.GuestAgentBin)
	}
}
