//go:build linux

package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"wb/internal/netguard"
	"wb/store"
)

// TestPlatformAddrs: the guard learns this host's interface addresses, Redis, the registered
// nodes and the gateways (known, and seen calling the node API with its token), and then
// refuses them even where an allow prefix would open them.
func TestPlatformAddrs(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	st := store.New(rdb)
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "node_far", Addr: "http://127.0.0.7:7070"}); err != nil {
		t.Fatal(err)
	}
	// A gateway on another host that has never called this node.
	if err := st.GatewayHeartbeat(ctx, store.GatewayInfo{ID: "gw_far", Addrs: []string{"http://127.0.0.30:8080", "127.0.0.31"}}); err != nil {
		t.Fatal(err)
	}
	g, err := netguard.New(netguard.Options{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	p := &platformAddrs{guards: []*netguard.Guard{g}, st: st, rdb: rdb, gateways: []string{"http://127.0.0.8:8080"},
		nodes: []string{"127.0.0.9:7071"}, log: slog.New(slog.DiscardHandler)}
	p.refresh(ctx)
	denied := g.Denied()
	for src, want := range map[string]string{"this host's interfaces": "127.0.0.1", "redis": "127.0.0.1", "nodes": "127.0.0.7", "gateways": "127.0.0.8"} {
		if !strings.Contains(" "+strings.Join(addrStrings(denied[src]), " ")+" ", " "+want+" ") {
			t.Errorf("%s: %v; want %s among them", src, denied[src], want)
		}
	}
	for _, a := range []string{"127.0.0.1", "127.0.0.7", "127.0.0.8", "127.0.0.9", "127.0.0.30", "127.0.0.31"} {
		if err := g.Check(netip.MustParseAddr(a)); err == nil || !strings.Contains(err.Error(), "platform itself") {
			t.Errorf("%s: %v; want it refused as the platform's", a, err)
		}
	}
	if err := g.Check(netip.MustParseAddr("127.0.0.2")); err != nil {
		t.Errorf("127.0.0.2, allowed and not the platform's: %v", err)
	}
	// A gateway calling the node API with the token is learned at once.
	h := p.learnGateways(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), "tok")
	for _, auth := range []string{"Bearer wrong", "Bearer tok"} {
		r := httptest.NewRequest("GET", "/v1/x", nil)
		r.RemoteAddr = map[string]string{"Bearer wrong": "127.0.0.20:5555", "Bearer tok": "127.0.0.21:5555"}[auth]
		r.Header.Set("Authorization", auth)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	if g.Check(netip.MustParseAddr("127.0.0.21")) == nil || g.Check(netip.MustParseAddr("127.0.0.20")) != nil {
		t.Errorf("learned gateways: %v", g.Denied()["gateways"])
	}
	if g.Check(netip.MustParseAddr("127.0.0.30")) == nil {
		t.Errorf("learning a gateway forgot the registered ones: %v", g.Denied()["gateways"])
	}
}

// TestRegisterGateway: a gateway registers its URLs, its ext_authz and edge addresses and this
// host's interfaces while it runs, and removes itself when it stops.
func TestRegisterGateway(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	st := store.New(rdb)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		registerGateway(ctx, st, "gw_test", []string{"http://gw.example:8080"}, "127.0.0.9:9001", "127.0.0.9:9443", slog.New(slog.DiscardHandler))
		close(done)
	}()
	var got []store.GatewayInfo
	for deadline := time.Now().Add(30 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		var err error
		if got, err = st.Gateways(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 1 || got[0].ID != "gw_test" || got[0].AuthzAddr != "127.0.0.9:9001" || got[0].EdgeAddr != "127.0.0.9:9443" {
		t.Fatalf("registered: %+v", got)
	}
	addrs := " " + strings.Join(got[0].Addrs, " ") + " "
	for _, want := range []string{"http://gw.example:8080", "127.0.0.9:9001", "127.0.0.9:9443", "127.0.0.1"} {
		if !strings.Contains(addrs, " "+want+" ") {
			t.Errorf("registered addresses %s lack %s", addrs, want)
		}
	}
	cancel()
	<-done
	if got, _ := st.Gateways(context.Background()); len(got) != 0 {
		t.Fatalf("still registered after stopping: %+v", got)
	}
}

func addrStrings(as []netip.Addr) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

// TestEgressAllowCIDRFlag: the flag repeats, and a bad value names what is expected.
func TestEgressAllowCIDRFlag(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f nodeFlags
	f.register(fs)
	if err := fs.Parse([]string{"--egress-allow-cidr", "10.20.0.0/16", "--egress-allow-cidr", "fd00:1::/64", "--egress-allow-cidr", "127.0.0.2"}); err != nil {
		t.Fatal(err)
	}
	if got := f.egressAllow.String(); got != "10.20.0.0/16,fd00:1::/64,127.0.0.2/32" {
		t.Fatalf("parsed %s", got)
	}
	err := fs.Parse([]string{"--egress-allow-cidr", "10.0.0.0/40"})
	if err == nil || !strings.Contains(err.Error(), "egress-allow-cidr") || !strings.Contains(err.Error(), "CIDR") {
		t.Fatalf("a bad prefix: %v", err)
	}
}
