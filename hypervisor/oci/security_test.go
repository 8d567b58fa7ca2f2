package oci_test

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/wbbin"
)

// dockerCapMask is CapBnd of Docker's default capability set (CHOWN, DAC_OVERRIDE, FOWNER,
// FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT, MKNOD,
// AUDIT_WRITE, SETFCAP).
const (
	dockerCapMask      = "00000000a80425fb"
	dockerCapMaskNoRaw = "00000000a80405fb"
)

var (
	wbBinOnce sync.Once
	wbBinDir  string // removed by TestMain
	wbBinPath string
	wbBinErr  error
)

// TestMain removes the agent that wbBinary put in a directory of its own (every make test
// left one behind, 7 MB each, before it did).
func TestMain(m *testing.M) {
	code := m.Run()
	if wbBinDir != "" {
		os.RemoveAll(wbBinDir)
	}
	os.Exit(code)
}

// wbBinary builds the static wb binary (the real agent) once per test process.
func wbBinary(t testing.TB) string {
	t.Helper()
	wbBinOnce.Do(func() {
		wbBinDir, wbBinErr = os.MkdirTemp("", "wb-oci-agent-")
		if wbBinErr != nil {
			return
		}
		if wbBinErr = os.Chmod(wbBinDir, 0o755); wbBinErr != nil {
			return
		}
		wbBinPath, wbBinErr = wbbin.Agent(wbBinDir)
	})
	if wbBinErr != nil {
		t.Fatalf("build wb: %v", wbBinErr)
	}
	return wbBinPath
}

// agentGuest boots a guest whose init is the real agent (its socket sealed, see
// Spec.AgentSocket) and returns a client of it.
func agentGuest(t *testing.T, d *oci.Driver, tpl templates.Template, binds []hypervisor.Bind) (hypervisor.Spec, *agent.Client) {
	t.Helper()
	s := guestSpec(t, tpl, "")
	s.AgentBin = wbBinary(t)
	s.AgentSocket = "agent.sock"
	s.Args = []string{hypervisor.GuestAgentBin, "agent", "--socket", hypervisor.GuestAgentDir + "/agent.sock", "--root", hypervisor.GuestWorkspace}
	s.ReadOnlyBinds = append(s.ReadOnlyBinds, binds...)
	track(t, d, s)
	ctx := ctxT(t, 3*time.Minute) // create, boot and the agent's first answer, on a cold, busy machine
	if err := d.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := d.Boot(ctx, s.ID); err != nil {
		t.Fatalf("boot: %v\nconsole: %s", err, readFileOr(d.ConsoleLog(s.ID)))
	}
	c := agent.NewClient(filepath.Join(s.AgentDir, "agent.sock"))
	t.Cleanup(c.Close)
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Health(hctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("agent never answered: %v\nconsole: %s", err, readFileOr(d.ConsoleLog(s.ID)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s, c
}

func readFileOr(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// sh runs script in the guest through the agent and returns its exit code and output.
func sh(t *testing.T, c *agent.Client, script string) (int, string) {
	t.Helper()
	res, err := c.Exec(ctxT(t, time.Minute), agent.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutS: 30}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return res.ExitCode, res.Stdout + res.Stderr
}

// mustFail runs script and fails the test when it succeeds.
func mustFail(t *testing.T, c *agent.Client, what, script string) {
	t.Helper()
	if rc, out := sh(t, c, script); rc == 0 {
		t.Errorf("%s: %q succeeded in the guest: %s", what, script, out)
	} else {
		t.Logf("%s: refused (exit %d): %s", what, rc, strings.TrimSpace(out))
	}
}

// TestGuestContainment tries, from inside a guest, what an attacker would: new namespaces,
// mounts, setuid files the host can see, the agent's socket, a write into a read-only
// toolchain's submount, code in data dirs, filling the agent dir. Runs on runc and runsc.
func TestGuestContainment(t *testing.T) {
	cat := catalog(t)
	// A host "toolchain" dir with a submount: a non-recursive read-only bind would leave the
	// submount writable.
	tool := filepath.Join(reachableTempDir(t), "tool")
	sub := filepath.Join(tool, "sub")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", sub, "tmpfs", 0, "size=1m,mode=0777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(sub, syscall.MNT_DETACH) })
	if runtime.GOARCH == "amd64" {
		if err := os.WriteFile(filepath.Join(tool, "int80"), int80Program(), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	binds := []hypervisor.Bind{{Source: tool, Target: "/opt/tool"}}

	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, rt)
			s, c := agentGuest(t, d, cat[templates.Base], binds)
			runc := rt == oci.RuntimeRunc

			// Syscall filter and capabilities.
			_, out := sh(t, c, "grep -E '^(Seccomp|CapBnd|CapEff|NoNewPrivs):' /proc/self/status")
			t.Logf("%s /proc/self/status:\n%s", rt, out)
			if !strings.Contains(out, "Seccomp:\t2") {
				t.Errorf("no seccomp filter in the guest: %s", out)
			}
			wantCaps := dockerCapMask
			if !runc {
				wantCaps = dockerCapMaskNoRaw // gVisor drops NET_RAW without --net-raw
			}
			if !strings.Contains(out, "CapBnd:\t"+wantCaps) {
				t.Errorf("bounding set is not Docker's default (%s): %s", wantCaps, out)
			}
			if runc && !strings.Contains(out, "NoNewPrivs:\t1") {
				t.Errorf("no_new_privs not set: %s", out)
			}

			// Guest root is an unprivileged host uid (runc).
			if runc {
				_, out = sh(t, c, "cat /proc/self/uid_map")
				if f := strings.Fields(out); len(f) != 3 || f[0] != "0" || f[1] == "0" {
					t.Errorf("guest root is host root: uid_map %q", out)
				}
			}
			mustFail(t, c, "new user namespace", "unshare -Ur true")
			if runtime.GOARCH == "amd64" {
				// The kernel's 32-bit entry (int $0x80) from a 64-bit program: the filter
				// admits the native ABI alone.
				mustFail(t, c, "a 32-bit system call", "/opt/tool/int80")
			}
			mustFail(t, c, "mount", "mount -t tmpfs x /mnt")
			mustFail(t, c, "remount the root", "mount -o remount,rw /")

			// A setuid-root file where the host can see it.
			sh(t, c, "cp /bin/busybox /workspace/suid && chmod 4755 /workspace/suid; ls -ln /workspace/suid")
			host := filepath.Join(hypervisor.WorkspaceDir(s.Writable), "suid")
			var st syscall.Stat_t
			if err := syscall.Stat(host, &st); err == nil {
				suidRoot := st.Mode&syscall.S_ISUID != 0 && st.Uid == 0
				var fs syscall.Statfs_t
				if err := syscall.Statfs(host, &fs); err != nil {
					t.Fatal(err)
				}
				nosuid := fs.Flags&0x2 != 0 // ST_NOSUID
				t.Logf("host sees %s: uid %d mode %o, mount nosuid=%v", host, st.Uid, st.Mode&0o7777, nosuid)
				if !nosuid {
					t.Errorf("the writable layer is not mounted nosuid on the host")
				}
				if runc && (suidRoot || st.Uid < 100000) {
					t.Errorf("guest made a file owned by host uid %d (setuid %v)", st.Uid, st.Mode&syscall.S_ISUID != 0)
				}
			}

			// Read-only toolchain, down through its submounts.
			mustFail(t, c, "write a toolchain dir", "echo x > /opt/tool/x")
			mustFail(t, c, "write a toolchain submount", "echo x > /opt/tool/sub/x")
			if _, err := os.Stat(filepath.Join(sub, "x")); err == nil {
				t.Errorf("guest wrote into the host's toolchain submount")
			}

			// Data dirs hold no programs; the workspace may.
			mustFail(t, c, "run a program from /tmp", "cp /bin/busybox /tmp/true && /tmp/true")
			mustFail(t, c, "run a program from /root", "cp /bin/busybox /root/true && /root/true")
			if rc, out := sh(t, c, "cp /bin/busybox /workspace/true && /workspace/true"); rc != 0 {
				t.Errorf("a program in /workspace does not run: %s", out)
			}

			// The agent dir: a small tmpfs on the host; under runc the guest cannot touch it.
			var afs syscall.Statfs_t
			if err := syscall.Statfs(s.AgentDir, &afs); err != nil {
				t.Fatal(err)
			}
			if afs.Type != 0x01021994 || afs.Blocks*uint64(afs.Bsize) > 4<<20 {
				t.Errorf("agent dir is not a small tmpfs: type %#x, %d bytes", afs.Type, afs.Blocks*uint64(afs.Bsize))
			}
			mustFail(t, c, "fill the agent dir", "dd if=/dev/zero of=/run/wb/big bs=1M count=8")
			if runc {
				mustFail(t, c, "remove the agent socket", "rm -f /run/wb/agent.sock && ! test -S /run/wb/agent.sock")
				mustFail(t, c, "replace the agent socket", "mv /run/wb/agent.sock /run/wb/a && true")
				mustFail(t, c, "plant a symlink at the agent socket", "ln -sf /etc/passwd /run/wb/agent.sock && test -L /run/wb/agent.sock")
				mustFail(t, c, "write beside the agent socket", "echo x > /run/wb/planted")
				mustFail(t, c, "chmod the agent dir", "chmod 777 /run/wb")
				if fi, err := os.Lstat(filepath.Join(s.AgentDir, "agent.sock")); err != nil || fi.Mode().Type() != os.ModeSocket {
					t.Errorf("agent socket after the attempts: %v, %v", fi, err)
				}
			}
			mustFail(t, c, "write the agent socket", "echo x > /run/wb/agent.sock")
			if err := c.Health(ctxT(t, 10*time.Second)); err != nil {
				t.Errorf("the agent stopped answering: %v", err)
			}
			if !runc {
				// Inside gVisor guest root owns its mounts, and the agent as well: it can
				// replace the socket, which cuts off only its own session. The node must
				// never follow what it planted to a host path.
				hostSock := filepath.Join(reachableTempDir(t), "host.sock")
				ln, err := net.Listen("unix", hostSock)
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				sh(t, c, "rm -f /run/wb/agent.sock && ln -s "+hostSock+" /run/wb/agent.sock")
				if fi, err := os.Lstat(filepath.Join(s.AgentDir, "agent.sock")); err != nil || fi.Mode().Type() != os.ModeSymlink {
					t.Fatalf("the guest's symlink did not reach the host's agent dir: %v, %v", fi, err)
				}
				conn, err := agent.DialSocket(ctxT(t, 10*time.Second), filepath.Join(s.AgentDir, "agent.sock"))
				if err == nil {
					conn.Close()
				}
				if err == nil || !strings.Contains(err.Error(), "agent.sock") {
					t.Errorf("dial through the guest's symlink: %v; want a refusal to follow it", err)
				}
				t.Logf("dial through the guest's symlink: %v", err)
				ln.(*net.UnixListener).SetDeadline(time.Now().Add(100 * time.Millisecond))
				if conn, err := ln.Accept(); err == nil {
					conn.Close()
					t.Error("the host socket behind the guest's symlink saw a connection")
				}
			}
		})
	}
}

// TestDiskLimitRequired: a guest whose disk limit cannot be made (no mkfs.ext4 here) does not
// start, and the error names the fix; with AllowUnlimitedDisk it starts without one.
func TestDiskLimitRequired(t *testing.T) {
	cat := catalog(t)
	d := newDriver(t, oci.RuntimeRunc)
	runcPath, err := exec.LookPath(oci.RuntimeRunc)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir()) // mkfs.ext4 and mount are not found
	s := guestSpec(t, cat[templates.Base], jobRunner)
	track(t, d, s)
	err = d.Create(ctxT(t, time.Minute), s)
	if err == nil {
		t.Fatal("a guest without its disk limit was created")
	}
	for _, want := range []string{"disk limit", "--allow-unlimited-disk"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := os.Stat(s.Writable + ".img"); err == nil {
		t.Error("a failed disk image was left behind")
	}

	base := reachableTempDir(t)
	d2, err := oci.New(oci.Options{Runtime: oci.RuntimeRunc, RuntimePath: runcPath, StateRoot: filepath.Join(base, "state"),
		BundleRoot: filepath.Join(base, "bundles"), CgroupParent: "/wbtest-" + randHex(t, 4), AllowUnlimitedDisk: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d2.RemoveCgroupParent() })
	s2 := guestSpec(t, cat[templates.Base], jobRunner)
	track(t, d2, s2)
	if err := d2.Create(ctxT(t, time.Minute), s2); err != nil {
		t.Fatalf("with AllowUnlimitedDisk: %v", err)
	}
}

// int80Program is a static x86-64 Linux program, a bare ELF file of 152 bytes, that makes
// one system call through the kernel's 32-bit entry (getpid, int $0x80) and exits 0 when it
// was answered, 1 when it failed; a filter that refuses the 32-bit ABI kills it (SIGSYS).
func int80Program() []byte {
	code := []byte{
		0xb8, 0x14, 0x00, 0x00, 0x00, // mov eax, 20 (getpid on i386)
		0xcd, 0x80, // int 0x80
		0x85, 0xc0, // test eax, eax
		0x78, 0x09, // js fail
		0x31, 0xff, // xor edi, edi
		0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60 (exit)
		0x0f, 0x05, // syscall
		0xbf, 0x01, 0x00, 0x00, 0x00, // fail: mov edi, 1
		0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60
		0x0f, 0x05, // syscall
	}
	const base, headers = 0x400000, 64 + 56
	le := binary.LittleEndian
	b := make([]byte, headers, headers+len(code))
	copy(b, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1}) // 64-bit, little-endian, version 1
	le.PutUint16(b[16:], 2)                       // an executable
	le.PutUint16(b[18:], 0x3e)                    // x86-64
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[24:], base+headers) // entry: the code after the headers
	le.PutUint64(b[32:], 64)           // program headers at 64
	le.PutUint16(b[52:], 64)           // ELF header size
	le.PutUint16(b[54:], 56)           // program header size
	le.PutUint16(b[56:], 1)            // one program header
	ph := b[64:]
	le.PutUint32(ph[0:], 1) // PT_LOAD
	le.PutUint32(ph[4:], 5) // readable, executable
	le.PutUint64(ph[16:], base)
	le.PutUint64(ph[24:], base)
	le.PutUint64(ph[32:], uint64(headers+len(code)))
	le.PutUint64(ph[40:], uint64(headers+len(code)))
	le.PutUint64(ph[48:], 0x1000)
	return append(b, code...)
}

// TestExecOfFifoAnswered: an exec whose command is a FIFO is answered (126, as a shell) and
// leaves the agent serving. runsc's execve opens a FIFO before it looks at its type and waits
// there for a writer: the start never returned, the exec's timeout was never armed, every
// later start waited behind it, and with the agent's one P (WB_AGENT_GOMAXPROCS=1) the health
// probe too.
func TestExecOfFifoAnswered(t *testing.T) {
	cat := catalog(t)
	d := newDriver(t, oci.RuntimeRunsc)
	_, c := agentGuest(t, d, cat[templates.Base], nil)
	if rc, out := sh(t, c, "mkfifo -m 0777 /tmp/fifo"); rc != 0 {
		t.Fatalf("mkfifo: exit %d: %s", rc, out)
	}
	ctx := ctxT(t, 60*time.Second) // the exec's own timeout is 5 s
	res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"/tmp/fifo"}, TimeoutS: 5}, nil)
	if err != nil {
		t.Fatalf("exec of a FIFO was not answered: %v", err)
	}
	if res.ExitCode != agent.ExitCannotRun {
		t.Fatalf("exec of a FIFO: exit %d, stderr %q; want %d", res.ExitCode, res.Stderr, agent.ExitCannotRun)
	}
	if err := c.Health(ctx); err != nil {
		t.Fatalf("the agent after an exec of a FIFO: %v", err)
	}
	if rc, out := sh(t, c, "true"); rc != 0 {
		t.Fatalf("an exec after an exec of a FIFO: exit %d: %s", rc, out)
	}
}
