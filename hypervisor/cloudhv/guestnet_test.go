package cloudhv

import (
	"bufio"
	"context"
	"crypto/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	defer ln.Close()
	go relay(ln, sock)
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
