package cloudhv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv/chapi"
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
	// guestNetDev is the guest's interface: virtio-net's first device in a guest kernel.
	guestNetDev = "eth0"
	// netnsDir is where `ip netns` keeps its named namespaces (bind mounts of nsfs).
	netnsDir = "/run/netns"
)

// guestNetMaskDotted is guestNetMask as the dotted netmask CH's NetConfig and Linux's ip=
// take.
var guestNetMaskDotted = net.IP(net.CIDRMask(guestNetMask, 32)).String()

// netnsPrefix is the prefix of the names of this driver's namespaces: "wbch-", eight hex
// digits of the state dir's path (two drivers on one host, each with its own state dir, may
// have guests of the same id) and "-". A namespace name is a file name in /run/netns.
func netnsPrefix(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return "wbch-" + hex.EncodeToString(sum[:4]) + "-"
}

// NetNamespace is the name (in /run/netns) of guest id's network namespace, which holds its
// tap and its relay to the egress proxy.
func (d *Driver) NetNamespace(id string) string { return d.nsPrefix + id }

// GuestProxy is the egress proxy's address as a guest reaches it: the relay on the host end of
// its tap (hypervisor.EgressRelayer).
func (d *Driver) GuestProxy() string {
	return net.JoinHostPort(guestNetHost, fmt.Sprint(egressPort))
}

// guestMAC is the MAC address of guest id's virtio-net device: locally administered, unicast,
// and derived from the id, so a restarted node's driver would give the same.
func guestMAC(id string) string {
	sum := sha256.Sum256([]byte(id))
	sum[0] = sum[0]&0xfe | 0x02
	return net.HardwareAddr(sum[:6]).String()
}

// netConfig is the VM's one virtio-net device: CH opens tap0 in the namespace it runs in and
// gives it ip and mask (the host end, as setupGuestNet made it already; CH's NetConfig.ip is
// the tap's, not the guest's); the guest's own address is on its command line (guestIPParam).
func netConfig(id string) chapi.NetConfig {
	return chapi.NetConfig{ID: "net0", Tap: guestTap, IP: guestNetHost, Mask: guestNetMaskDotted, Mac: guestMAC(id)}
}

// guestIPParam is Linux's ip= parameter for the guest's address (client:server:gateway:
// netmask:hostname:device:autoconf): 10.0.0.2/30 on eth0 with the host end as its gateway.
// The guest's kernel applies it when virtio-net is built in, else the image's initramfs
// after loading the module; the fake VMM's "kernel" applies it to its guest's interface.
func guestIPParam() string {
	return fmt.Sprintf("ip=%s::%s:%s::%s:off", guestNetGuest, guestNetHost, guestNetMaskDotted, guestNetDev)
}

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

// listenIn listens on TCP addr inside network namespace ns, with SO_REUSEPORT: a restarted
// node's driver listens again while the previous process's listener may not be closed yet
// (two drivers in one process, as in tests); both relay to the same socket path.
func listenIn(ns, addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return inNetns(ns, func() (net.Listener, error) { return lc.Listen(context.Background(), "tcp", addr) })
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
		fd, err := unix.Open(filepath.Join(netnsDir, ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
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

// guestRelay is the relay of one guest's namespace, served by this process: it splices each
// connection accepted on ln to the Unix socket target (the node's egress proxy for this guest).
type guestRelay struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed when the relay has ended, its connections too
	mu     sync.Mutex
	conns  map[net.Conn]struct{} // both ends of each relayed connection; nil once stopped
}

func newGuestRelay(ln net.Listener, target string) *guestRelay {
	return &guestRelay{ln: ln, target: target, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
}

// serve relays each connection accepted on gr.ln until stop.
func (gr *guestRelay) serve() {
	var wg sync.WaitGroup
	defer close(gr.done)
	defer wg.Wait()
	for {
		c, err := gr.ln.Accept()
		if err != nil {
			return
		}
		if !gr.track(c) {
			return
		}
		wg.Go(func() { gr.splice(c) })
	}
}

// splice copies between guest connection c and a new connection to gr.target until either
// side ends or stop closes them.
func (gr *guestRelay) splice(c net.Conn) {
	defer gr.untrack(c)
	up, err := net.Dial("unix", gr.target)
	if err != nil {
		return
	}
	if !gr.track(up) {
		return
	}
	defer gr.untrack(up)
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
}

// track adds c to the relayed connections, or closes it and answers false once stopped.
func (gr *guestRelay) track(c net.Conn) bool {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	if gr.conns == nil {
		_ = c.Close()
		return false
	}
	gr.conns[c] = struct{}{}
	return true
}

// untrack closes c and drops it from the relayed connections.
func (gr *guestRelay) untrack(c net.Conn) {
	gr.mu.Lock()
	delete(gr.conns, c)
	gr.mu.Unlock()
	_ = c.Close()
}

// stop closes the listener and every relayed connection, both ends, and waits (until ctx
// ends) for the relay to end. Its connections are closed rather than waited for: one that the
// guest holds open, or whose guest end vanished with its VMM (no FIN), would end only when
// TCP's keepalive gives up, or never while the proxy keeps its end open.
func (gr *guestRelay) stop(ctx context.Context) {
	gr.mu.Lock()
	conns := gr.conns
	gr.conns = nil
	gr.mu.Unlock()
	_ = gr.ln.Close()
	for c := range conns {
		_ = c.Close()
	}
	select {
	case <-gr.done:
	case <-ctx.Done():
	}
}

// startRelay listens on guestNetHost:egressPort in r's namespace and relays each connection
// to the node's egress socket in r's agent dir, until stopRelay or r's VMM exits (a guest
// with no VMM reaches nothing; a relay of a previous driver in this process ends so too).
func (d *Driver) startRelay(r record) error {
	id := r.Spec.ID
	ln, err := listenIn(d.NetNamespace(id), d.GuestProxy())
	if err != nil {
		return fmt.Errorf("cloudhv: guest %s: egress relay: %w", id, err)
	}
	gr := newGuestRelay(ln, filepath.Join(r.Spec.AgentDir, hypervisor.EgressSocket))
	if old, loaded := d.relays.Swap(id, gr); loaded {
		old.(*guestRelay).stop(context.Background())
	}
	go gr.serve()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-gr.done:
				return
			case <-t.C:
				if !r.alive() {
					gr.stop(context.Background())
					d.relays.CompareAndDelete(id, gr)
					return
				}
			}
		}
	}()
	return nil
}

// stopRelay ends guest id's relay, if this process serves one, and the connections it relays.
func (d *Driver) stopRelay(ctx context.Context, id string) {
	if v, ok := d.relays.LoadAndDelete(id); ok {
		v.(*guestRelay).stop(ctx)
	}
}

// Close ends the egress relays and the copies of consoles and VMM logs that this driver
// serves, as the end of the node's process does: the guests, their namespaces and VMMs stay,
// and a new driver on the same state dir serves their relays and copies again.
func (d *Driver) Close() {
	d.relays.Range(func(id, _ any) bool {
		d.stopRelay(context.Background(), id.(string))
		return true
	})
	d.copies.Range(func(k, _ any) bool {
		d.stopCopy(k.(copyKey).id, k.(copyKey).name)
		return true
	})
}

// adoptNetworks is a (restarted) driver's look at the namespaces of its guests: a running
// guest's relay is served again (the previous process's died with it), and a namespace whose
// guest has no record any more (a create or delete that did not finish) is removed. A
// stopped guest's namespace stays until Delete.
func (d *Driver) adoptNetworks(ctx context.Context) error {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cloudhv: guest networks: %w", err)
	}
	var errs []error
	for _, e := range ents {
		id, ok := strings.CutPrefix(e.Name(), d.nsPrefix)
		if !ok {
			continue
		}
		r, err := d.load(id)
		switch {
		case errors.Is(err, hypervisor.ErrNotFound):
			d.log.Info("removing the network namespace of a guest that no longer exists", "netns", e.Name())
			errs = append(errs, removeGuestNet(ctx, e.Name()))
		case err != nil:
			errs = append(errs, err)
		case r.alive():
			errs = append(errs, d.startRelay(r))
		}
	}
	return errors.Join(errs...)
}

// startInNetns starts cmd with its network namespace ns: the fork happens on a thread that
// entered ns (inNetns), so the child starts there, opens its tap there and never runs a
// moment in the node's namespace. (`ip netns exec` would also unshare a mount namespace and
// remount /sys, hiding the VMM's mounts from the node; nsenter would be one more program.)
func startInNetns(ns string, cmd *exec.Cmd) error {
	_, err := inNetns(ns, func() (struct{}, error) { return struct{}{}, cmd.Start() })
	return err
}
