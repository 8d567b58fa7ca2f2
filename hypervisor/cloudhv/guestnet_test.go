package cloudhv

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestGuestNet sets a guest's network up in a namespace the test makes (guestNetCommands):
// it holds only lo and tap0 (10.0.0.1/30, up) and no route but the tap's /30; the relay on
// 10.0.0.1:3128 reaches the egress socket; the host's own loopback listener, another port
// of the tap address and an address outside the /30 are out of reach from inside.
func TestGuestNet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := "wbt-" + strings.ToLower(rand.Text()[:8])
	if err := setupGuestNet(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeGuestNet(context.Background(), ns); err != nil {
			t.Error(err)
		}
	})
	ip := func(args ...string) string {
		out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", ns}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	var links []string
	for line := range strings.SplitSeq(strings.TrimSpace(ip("-o", "link", "show")), "\n") {
		f := strings.Fields(line)
		links = append(links, strings.TrimSuffix(f[1], ":"))
	}
	if strings.Join(links, " ") != "lo "+guestTap {
		t.Errorf("links in the guest's namespace: %v; want lo and %s only", links, guestTap)
	}
	if a := ip("-o", "-4", "addr", "show", "dev", guestTap); !strings.Contains(a, "inet 10.0.0.1/30") {
		t.Errorf("tap address: %s", a)
	}
	if l := ip("link", "show", guestTap); !strings.Contains(l, "UP") {
		t.Errorf("tap not up: %s", l)
	}
	if r := strings.TrimSpace(ip("-4", "route", "show")); !strings.HasPrefix(r, "10.0.0.0/30 dev tap0") || strings.Contains(r, "\n") {
		t.Errorf("routes: %q; want only the tap's /30 (no default route)", r)
	}

	// The egress socket (the node's proxy) echoes a line; the relay listens on the tap address.
	sock := filepath.Join(t.TempDir(), "egress.sock")
	up, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("proxy: " + line))
			}()
		}
	}()
	ln, err := listenIn(ns, net.JoinHostPort(guestNetHost, "3128"))
	if err != nil {
		t.Fatal(err)
	}
	gr := newGuestRelay(ln, sock)
	defer gr.stop(context.Background())
	go gr.serve()
	dialIn := func(addr string) (net.Conn, error) {
		return inNetns(ns, func() (net.Conn, error) { return net.DialTimeout("tcp", addr, 2*time.Second) })
	}
	c, err := dialIn("10.0.0.1:3128")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("hello\n"))
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "proxy: hello\n" {
		t.Errorf("through the relay: %q, %v", got, err)
	}
	c.Close()

	// The attack: whatever else listens on the host is out of reach.
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	for _, addr := range []string{host.Addr().String(), "10.0.0.1:22", "10.0.0.5:80"} {
		if c, err := dialIn(addr); err == nil {
			c.Close()
			t.Errorf("the guest's namespace reached %s", addr)
		}
	}
}

// TestRelayStopEndsItsConnections: a connection the relay splices, which neither the guest nor
// the proxy ends (an idle keep-alive, a tunnel), is closed by stop at both ends, and stop
// returns at once rather than wait for it.
func TestRelayStopEndsItsConnections(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "egress.sock")
	up, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	proxyEnd := make(chan error, 1) // how the proxy's end of the connection ended
	go func() {
		c, err := up.Accept()
		if err != nil {
			proxyEnd <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(io.Discard, c) // holds its end open until the relay's ends
		proxyEnd <- err
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gr := newGuestRelay(ln, sock)
	go gr.serve()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("CONNECT example.com:443 HTTP/1.1\r\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		gr.mu.Lock()
		n := len(gr.conns)
		gr.mu.Unlock()
		if n == 2 { // the guest's end and the proxy's
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay holds %d connections; want the guest's and the proxy's", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		gr.stop(ctx)
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("stop has not returned 5 s after it was called: it waits for the connection held open rather than close it")
	}
	select {
	case <-gr.done:
	default:
		t.Error("stop returned before the relay ended")
	}
	select {
	case <-proxyEnd:
	case <-time.After(5 * time.Second):
		t.Error("the proxy's end of the relayed connection is still open after stop")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the guest's end after stop: read %v; want it closed", err)
	}
}
