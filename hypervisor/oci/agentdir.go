package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"wb/hypervisor"
)

const (
	// agentDirTmpfs bounds the agent dir (sockets and a few small files): a guest cannot fill
	// the host's disk through it.
	agentDirTmpfs = "size=1m,nr_inodes=1024,mode=0755"
	// agentSocketWait is how long Boot waits for the agent to bind its socket before sealing.
	agentSocketWait = 30 * time.Second
)

// consoleTmpfs bounds a guest's console log. The guest's init (its agent) writes to it, and
// so can guest root: under runsc, /proc/1/fd/2 reopens the agent's stderr, the host file
// itself, which grew on the host's disk past the guest's disk allowance. On a tmpfs of its
// own, a write past the bound fails with ENOSPC; the agent's own log (a line an exec) fills it
// only after tens of thousands of commands, and the runtime's errors before any of them.
const consoleTmpfs = "size=4m,nr_inodes=16,mode=0700"

// mountConsole puts the console log's tmpfs on bundle's console dir. Idempotent.
func mountConsole(bundle string) error {
	dir := filepath.Join(bundle, consoleDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("oci: console log: %w", err)
	}
	return mountTmpfs(dir, consoleTmpfs, "console log")
}

// unmountConsole removes the console log's tmpfs from bundle, if it has one.
func unmountConsole(bundle string) error {
	return unmountTmpfs(filepath.Join(bundle, consoleDir), "console log")
}

// mountTmpfs mounts a tmpfs with data (nosuid, nodev, noexec) on dir, unless dir is a mount
// point already; what names it in errors.
func mountTmpfs(dir, data, what string) error {
	if mounted(dir) {
		return nil
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, data); err != nil {
		return fmt.Errorf("oci: %s %s: mount a tmpfs: %w", what, dir, err)
	}
	return nil
}

// unmountTmpfs detaches the mount on dir, if it is a mount point; what names it in errors.
func unmountTmpfs(dir, what string) error {
	if !mounted(dir) {
		return nil
	}
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("oci: unmount the %s: %w", what, err)
	}
	return nil
}

// userNS reports whether this driver's guests get a user namespace (see specOptions.userNS).
func (d *Driver) userNS() bool { return d.name == RuntimeRunc }

// mountAgentDir puts a small tmpfs on the host's agent dir, owned by guest root so that the
// agent can bind its socket there (sealAgentDir takes it back). Idempotent.
func (d *Driver) mountAgentDir(s hypervisor.Spec) error {
	owner := 0
	if d.userNS() {
		owner = guestRootID
	}
	return mountTmpfs(s.AgentDir, fmt.Sprintf("%s,uid=%d,gid=%d", agentDirTmpfs, owner, owner), "agent dir")
}

// unmountAgentDir removes the agent dir's tmpfs, if it has one.
func unmountAgentDir(s hypervisor.Spec) error {
	if s.AgentDir == "" {
		return nil
	}
	return unmountTmpfs(s.AgentDir, "agent dir")
}

// sealAgentDir waits until the agent has bound Spec.AgentSocket, then gives the agent dir to
// host root (mode 0755): guest root, an unmapped-to-root host uid, can then neither remove nor
// replace the socket, nor plant anything beside it. Only runc guests (user namespace) can be
// sealed this way; inside gVisor, guest root is root over its own mounts.
func (d *Driver) sealAgentDir(ctx context.Context, s hypervisor.Spec) error {
	if s.AgentSocket == "" || !d.userNS() {
		return nil
	}
	sock := filepath.Join(s.AgentDir, s.AgentSocket)
	isSocket := func() (bool, error) {
		fi, err := os.Lstat(sock)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("oci: agent socket: %w", err)
		}
		if fi.Mode().Type() != fs.ModeSocket {
			return false, fmt.Errorf("oci: guest %s: %s is a %v, not the agent's socket", s.ID, s.AgentSocket, fi.Mode().Type())
		}
		return true, nil
	}
	deadline := time.Now().Add(agentSocketWait)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		ok, err := isSocket()
		if err != nil {
			return err
		}
		if ok {
			break
		}
		if n%40 == 39 && d.stopped(ctx, s.ID) {
			return fmt.Errorf("oci: guest %s exited before its agent listened on %s", s.ID, s.AgentSocket)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("oci: guest %s: the agent did not listen on %s within %v", s.ID, s.AgentSocket, agentSocketWait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("oci: guest %s: waiting for the agent's socket: %w", s.ID, ctx.Err())
		case <-tick.C:
		}
	}
	if err := os.Lchown(s.AgentDir, 0, 0); err != nil {
		return fmt.Errorf("oci: seal the agent dir: %w", err)
	}
	if err := os.Chmod(s.AgentDir, 0o755); err != nil {
		return fmt.Errorf("oci: seal the agent dir: %w", err)
	}
	// The socket must still be the one the agent bound (nothing else ran to swap it, but check).
	if ok, err := isSocket(); err != nil || !ok {
		return errors.Join(fmt.Errorf("oci: guest %s: the agent's socket changed while sealing", s.ID), err)
	}
	return nil
}

// checkReachable makes sure guest root (an unprivileged host uid under runc's user namespace)
// can reach every host path the guest mounts: each parent directory must let others search it.
func (d *Driver) checkReachable(s hypervisor.Spec) error {
	if !d.userNS() {
		return nil
	}
	paths := []string{s.RootFS, s.Writable, s.AgentDir}
	if s.AgentBin != "" {
		paths = append(paths, s.AgentBin)
	}
	for _, b := range s.ReadOnlyBinds {
		paths = append(paths, b.Source)
	}
	for _, p := range paths {
		for dir := filepath.Dir(filepath.Clean(p)); ; dir = filepath.Dir(dir) {
			fi, err := os.Stat(dir)
			if err != nil {
				return fmt.Errorf("oci: %s: %w", dir, err)
			}
			if fi.Mode().Perm()&0o001 == 0 {
				return fmt.Errorf("oci: guest root (host uid %d) cannot reach %s: directory %s has mode %v; chmod o+x %s",
					guestRootID, p, dir, fi.Mode().Perm(), dir)
			}
			if dir == "/" {
				break
			}
		}
	}
	return nil
}

// stopped reports whether guest id has stopped: for a guest this driver created, from its
// init's process (knownState), without `runc state`, a process start (about 9 ms of CPU here)
// that a wait for a slow agent on a loaded host paid every 200 ms; else as the runtime says.
func (d *Driver) stopped(ctx context.Context, id string) bool {
	if st, ok := d.knownState(id); ok {
		return st == hypervisor.StateStopped
	}
	info, err := d.Info(ctx, id)
	return err == nil && info.State == hypervisor.StateStopped
}
