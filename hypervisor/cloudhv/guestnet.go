package cloudhv

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Guest network (see doc.go): each guest gets a network namespace of its own holding only
// loopback and tap0, the tap the VM's virtio-net device uses; the host end of the tap has
// guestNetHost/30, the guest guestNetGuest. The namespace has no other interface and no
// route but the tap's /30, so the only thing a guest can reach is what listens in it: the
// relay to the node's egress proxy on guestNetHost:egressPort.
const (
	guestTap      = "tap0"
	guestNetHost  = "10.0.0.1"
	guestNetGuest = "10.0.0.2"
	guestNetMask  = 30
	egressPort    = 3128
)

// guestNetCommands are the commands that set up a guest's network in the named namespace
// ns (each run as `ip ARGS...`).
func guestNetCommands(ns string) [][]string {
	return [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "tuntap", "add", "dev", guestTap, "mode", "tap"},
		{"-n", ns, "addr", "add", fmt.Sprintf("%s/%d", guestNetHost, guestNetMask), "dev", guestTap},
		{"-n", ns, "link", "set", guestTap, "up"},
	}
}

// setupGuestNet makes namespace ns with the guest's tap (guestNetCommands); on an error
// what was made is removed.
func setupGuestNet(ctx context.Context, ns string) error {
	for _, args := range guestNetCommands(ns) {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			_ = removeGuestNet(context.WithoutCancel(ctx), ns)
			return fmt.Errorf("cloudhv: guest network: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// removeGuestNet deletes namespace ns and with it the tap.
func removeGuestNet(ctx context.Context, ns string) error {
	out, err := exec.CommandContext(ctx, "ip", "netns", "delete", ns).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "No such file") {
		return fmt.Errorf("cloudhv: ip netns delete %s: %w: %s", ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// listenIn listens on TCP addr inside network namespace ns.
func listenIn(ns, addr string) (net.Listener, error) {
	return inNetns(ns, func() (net.Listener, error) { return net.Listen("tcp", addr) })
}

// inNetns runs f on a thread that entered network namespace ns: a socket belongs to the
// namespace it was made in, wherever it is used later. The thread is discarded afterwards
// (its goroutine ends locked), so no other goroutine runs in ns.
func inNetns[T any](ns string, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		var r result
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			r.err = fmt.Errorf("cloudhv: open netns %s: %w", ns, err)
		} else {
			if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
				r.err = fmt.Errorf("cloudhv: enter netns %s: %w", ns, err)
			} else {
				r.v, r.err = f()
			}
			_ = unix.Close(fd)
		}
		ch <- r
	}()
	r := <-ch
	return r.v, r.err
}

// relay serves ln by splicing each connection to the Unix socket at target (the node's
// egress proxy for this guest) until ln is closed.
func relay(ln net.Listener, target string) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			up, err := net.Dial("unix", target)
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(up, c)
				if cw, ok := up.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
				close(done)
			}()
			_, _ = io.Copy(c, up)
			_ = c.Close()
			<-done
		}()
	}
}
