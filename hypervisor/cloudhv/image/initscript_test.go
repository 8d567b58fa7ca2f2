package image

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeBusybox stands for /bin/busybox in the initramfs under test: it runs the real one's sh
// and cat, answers /proc/cmdline from /cmdline, and records every other call (mount, insmod,
// switch_root with the environment it would pass) in /log instead of doing it.
const fakeBusybox = `#!/real/busybox sh
case "$1" in
sh) shift; exec /real/busybox sh "$@" ;;
env) shift; exec /real/busybox env "$@" ;;
cat) if [ "$2" = /proc/cmdline ]; then exec /real/busybox cat /cmdline; fi; exec /real/busybox "$@" ;;
usleep) exit 0 ;;
switch_root)
	# What this process was started with, before its own shell added anything.
	echo "$*" >> /log
	/real/busybox tr '\0' '\n' < /proc/$$/environ | /real/busybox sed 's/^/env /' >> /log
	exit 0 ;;
mount)
	echo "$*" >> /log
	# /proc for real (in the test's own mount namespace): switch_root's record reads it.
	if [ "$3" = proc ]; then /real/busybox mount -t proc proc /proc; fi ;;
*) echo "$*" >> /log ;;
esac
`

// TestInitScript runs the initramfs's /init in a chroot with busybox's actions recorded: it
// loads the modules in /modules' order, brings up loopback and ip='s address and default
// route (the driver's guest network), mounts root= read-only, moves /dev, and switches to
// init= with the arguments after "--" and the kernel's environment, adding nothing of its own.
func TestInitScript(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chroot)")
	}
	bb, err := findBusybox("")
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	for _, d := range []string{"bin", "real", "dev", "proc", "newroot"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := copyFile(bb, filepath.Join(dir, "real", "busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"bin/busybox": fakeBusybox,
		"init":        initScript,
		"modules":     "virtio\nvirtio_blk\n",
		"cmdline":     "console=hvc0 root=/dev/vdz ro ip=10.0.0.2::10.0.0.1:255.255.255.252::eth0:off init=/run/wb-bin/wb WB_X=1 -- agent --vsock-port 1024\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// As the kernel starts it: the command line's args after "--", and its environment.
	// ETXTBSY: a parallel test's fork, made while a file above was open to be written, holds
	// that file open until its child execs (golang/go#22315); the exec works once it has.
	for try := 0; ; try++ {
		cmd := exec.Command("/init", "agent", "--vsock-port", "1024")
		cmd.Env = []string{"HOME=/", "TERM=linux", "WB_X=1"}
		// A private mount namespace of its own (Go makes / private in it), for the fake's /proc.
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir, Unshareflags: syscall.CLONE_NEWNS}
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		if errors.Is(err, syscall.ETXTBSY) && try < 50 {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("/init: %v\n%s", err, out)
		}
		break
	}
	log, err := os.ReadFile(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	var calls, env []string
	for l := range strings.Lines(string(log)) {
		l = strings.TrimSuffix(l, "\n")
		if e, ok := strings.CutPrefix(l, "env "); ok {
			env = append(env, e)
		} else {
			calls = append(calls, l)
		}
	}
	want := []string{
		"mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev",
		"mount -t proc -o nosuid,nodev,noexec proc /proc",
		"insmod /lib/modules/virtio.ko",
		"insmod /lib/modules/virtio_blk.ko",
		"ifconfig lo 127.0.0.1 up",
		"ifconfig eth0 10.0.0.2 netmask 255.255.255.252 up",
		"route add default gw 10.0.0.1 dev eth0",
		"mount -t ext4 -o ro /dev/vdz /newroot",
		"umount /proc",
		"mount --move /dev /newroot/dev",
		"switch_root /newroot /run/wb-bin/wb agent --vsock-port 1024",
	}
	if !slices.Equal(calls, want) {
		t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(calls, "\n  "), strings.Join(want, "\n  "))
	}
	for _, e := range env {
		name, _, _ := strings.Cut(e, "=")
		if !slices.Contains([]string{"HOME", "TERM", "WB_X"}, name) {
			t.Errorf("init's environment gained %s", e)
		}
	}
	if !slices.Contains(env, "WB_X=1") {
		t.Errorf("init's environment lost WB_X=1: %v", env)
	}
}
