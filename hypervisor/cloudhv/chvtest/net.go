package chvtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// The fake's virtio-net (see doc.go): a net device whose tap exists in the VMM's network
// namespace is joined to a tap the fake makes in the runc guest's network namespace (the
// guest's eth0, eth1, ...), and Ethernet frames are copied between the two, counted as CH's
// virtio-net counts them: rx is what the guest received, tx what it sent.

// ipParam is what Linux's ip= parameter (Documentation/admin-guide/nfs/nfsroot.rst:
// client:server:gateway:netmask:hostname:device:autoconf) says of the guest's address.
type ipParam struct {
	Client, Gateway, Netmask, Device string
}

// parseIPParam reads the ip= word of cmdline (before " -- "); ok is false without one, or
// when it asks for autoconfiguration (dhcp, ...) the fake's kernel does not do.
func parseIPParam(cmdline string) (p ipParam, ok bool) {
	for _, w := range strings.Fields(cmdline) {
		if w == "--" {
			break
		}
		v, found := strings.CutPrefix(w, "ip=")
		if !found {
			continue
		}
		f := strings.Split(v, ":")
		for len(f) < 7 {
			f = append(f, "")
		}
		if net.ParseIP(f[0]) == nil {
			return ipParam{}, false
		}
		p = ipParam{Client: f[0], Gateway: f[2], Netmask: f[3], Device: f[5]}
		ok = true
	}
	return p, ok
}

// netLink is one net device joined to the guest: its two taps and its counters.
type netLink struct {
	id                string
	host, guest       *os.File
	rxBytes, rxFrames atomic.Uint64
	txBytes, txFrames atomic.Uint64
	wg                sync.WaitGroup
	closeOnce         sync.Once
}

func (l *netLink) counters() map[string]uint64 {
	return map[string]uint64{"rx_bytes": l.rxBytes.Load(), "rx_frames": l.rxFrames.Load(),
		"tx_bytes": l.txBytes.Load(), "tx_frames": l.txFrames.Load()}
}

func (l *netLink) close() {
	l.closeOnce.Do(func() {
		_ = l.host.Close()
		_ = l.guest.Close()
		l.wg.Wait()
	})
}

// openTap attaches to (or, CH-like, creates) tap name in the calling thread's network
// namespace; the file is non-blocking, so Close ends a pending Read.
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("tap %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}

// inGuestNetns runs f on a thread that entered the network namespace of process pid (the runc
// guest's init); commands f starts are forked from that thread, so they run there too. The
// thread is discarded afterwards.
func inGuestNetns(pid int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("guest network namespace: %w", err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter the guest's network namespace: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// linkNets joins each net device of the VM whose tap exists in the VMM's namespace to a tap
// in the guest's (ethN, in device order), gives that the MAC of the config and, for the
// device ip= names (the first when it names none), the address and default route the
// kernel's IP autoconfiguration would. A device whose tap does not exist is left unjoined
// (counters 0), so that a test never adds interfaces to the host's namespace.
func linkNets(ctx context.Context, g *guest, nets []netConfig, ip ipParam, hasIP bool) (_ []*netLink, err error) {
	var links []*netLink
	defer func() {
		if err != nil {
			for _, l := range links {
				l.close()
			}
		}
	}()
	for i, n := range nets {
		dev := fmt.Sprintf("eth%d", i)
		if n.Tap == "" {
			continue
		}
		if _, err := net.InterfaceByName(n.Tap); err != nil {
			g.log.Warn("net device left unjoined: its tap is not in the VMM's network namespace", "id", n.ID, "tap", n.Tap)
			continue
		}
		host, err := openTap(n.Tap)
		if err != nil {
			return nil, fmt.Errorf("Error creating virtio-net device %s: %w", n.ID, err)
		}
		l := &netLink{id: n.ID, host: host}
		err = inGuestNetns(g.pid, func() error {
			var terr error
			if l.guest, terr = openTap(dev); terr != nil {
				return terr
			}
			cmds := [][]string{}
			if n.Mac != "" {
				cmds = append(cmds, []string{"link", "set", "dev", dev, "address", n.Mac})
			}
			cmds = append(cmds, []string{"link", "set", "dev", dev, "up"})
			if hasIP && (ip.Device == dev || ip.Device == "" && i == 0) {
				mask := net.IPMask(net.ParseIP(ip.Netmask).To4())
				bits, _ := mask.Size()
				if ip.Netmask == "" || bits == 0 {
					bits = 24
				}
				cmds = append(cmds, []string{"addr", "add", fmt.Sprintf("%s/%d", ip.Client, bits), "dev", dev})
				if ip.Gateway != "" {
					cmds = append(cmds, []string{"route", "add", "default", "via", ip.Gateway, "dev", dev})
				}
			}
			for _, c := range cmds {
				if out, err := exec.CommandContext(ctx, "ip", c...).CombinedOutput(); err != nil {
					return fmt.Errorf("ip %s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
				}
			}
			return nil
		})
		if err != nil {
			_ = host.Close()
			if l.guest != nil {
				_ = l.guest.Close()
			}
			return nil, fmt.Errorf("Error creating virtio-net device %s: %w", n.ID, err)
		}
		l.wg.Add(2)
		go l.copyFrames(l.host, l.guest, &l.rxBytes, &l.rxFrames)
		go l.copyFrames(l.guest, l.host, &l.txBytes, &l.txFrames)
		links = append(links, l)
	}
	return links, nil
}

// copyFrames moves frames from one tap to the other until either is closed, counting them.
func (l *netLink) copyFrames(from, to *os.File, bytes, frames *atomic.Uint64) {
	defer l.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := from.Read(buf)
		if err != nil {
			return // closed (teardown), or the tap is gone
		}
		if _, err := to.Write(buf[:n]); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue // a link that is down drops the frame, as a NIC would
		}
		bytes.Add(uint64(n))
		frames.Add(1)
	}
}
