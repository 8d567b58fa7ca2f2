package main

import (
	"context"
	"crypto/subtle"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/mtls"
	"wb/internal/netguard"
	"wb/store"
)

// cidrFlag is a repeatable flag of allow prefixes (--egress-allow-cidr).
type cidrFlag struct{ prefixes []netip.Prefix }

func (f *cidrFlag) String() string {
	if f == nil {
		return ""
	}
	s := make([]string, len(f.prefixes))
	for i, p := range f.prefixes {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (f *cidrFlag) Set(v string) error {
	ps, err := netguard.ParsePrefixes([]string{v})
	if err != nil {
		return err
	}
	f.prefixes = append(f.prefixes, ps...)
	return nil
}

// platformAddrs keeps the guards' lists of the platform's own addresses current: this host's
// interfaces, Redis, the registered nodes and the gateways, none of which a guest or a
// webhook may reach whatever the operator's allow prefixes say.
type platformAddrs struct {
	guards   []*netguard.Guard
	st       *store.Store
	rdb      redis.UniversalClient
	gateways []string // URLs or host:port of the gateways known at start
	nodes    []string // of the nodes known at start (this one's own API), besides the registered
	log      *slog.Logger

	mu         sync.Mutex
	registered []netip.Addr // of the gateways registered in Redis
	learned    []netip.Addr // gateways seen calling the node API with its token
}

// refreshEvery is how often the platform's addresses are looked at again (nodes join and
// leave; names move).
const refreshEvery = 10 * time.Second

func (p *platformAddrs) run(ctx context.Context) {
	tick := time.NewTicker(refreshEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			p.refresh(ctx)
		}
	}
}

// refresh looks every source up again; a source that fails keeps its previous addresses.
func (p *platformAddrs) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if as, err := hostAddrs(); err == nil {
		p.set("this host's interfaces", as)
	}
	p.set("redis", p.resolveAll(ctx, redisAddrs(ctx, p.rdb)))
	if p.st == nil {
		p.set("nodes", p.resolveAll(ctx, p.nodes))
	} else {
		if gws, err := p.st.Gateways(ctx); err == nil {
			var hosts []string
			for _, g := range gws {
				hosts = append(hosts, g.Addrs...)
			}
			as := p.resolveAll(ctx, hosts)
			p.mu.Lock()
			p.registered = as
			p.mu.Unlock()
		} else {
			p.log.Warn("egress guard: list gateways", "err", err)
		}
		if nodes, err := p.st.Nodes(ctx); err == nil {
			hosts := slices.Clone(p.nodes)
			for _, n := range nodes {
				hosts = append(hosts, n.Addr)
			}
			p.set("nodes", p.resolveAll(ctx, hosts))
		} else {
			p.log.Warn("egress guard: list nodes", "err", err)
		}
	}
	p.refreshGateways(ctx)
}

func (p *platformAddrs) set(source string, addrs []netip.Addr) {
	for _, g := range p.guards {
		g.SetDenied(source, addrs)
	}
}

// resolveAll resolves each of hosts (a URL, host:port or host) with the system resolver.
func (p *platformAddrs) resolveAll(ctx context.Context, hosts []string) []netip.Addr {
	var out []netip.Addr
	for _, h := range hosts {
		if u, err := url.Parse(h); err == nil && u.Host != "" {
			h = u.Host
		}
		if host, _, err := net.SplitHostPort(h); err == nil {
			h = host
		}
		h = strings.Trim(h, "[]")
		if h == "" {
			continue
		}
		if a, err := netip.ParseAddr(h); err == nil {
			out = append(out, a.Unmap())
			continue
		}
		as, err := net.DefaultResolver.LookupNetIP(ctx, "ip", h)
		if err != nil {
			p.log.Warn("egress guard: resolve a platform address", "host", h, "err", err)
			continue
		}
		for _, a := range as {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// learnGateways wraps the node API: the address of every caller that presents the node
// token is a gateway's, and joins the denied addresses at once. Over mutual TLS only a
// certificate of the gateway role is: an Envoy's reaches /healthz (gatewaysOnly), and its
// address, token or not, is not a gateway's.
func (p *platformAddrs) learnGateways(h http.Handler, token string) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gateway := r.TLS == nil || mtls.HasRole(r.TLS.PeerCertificates, mtls.RoleGateway)
		if gateway && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) == 1 {
			if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
				a := ap.Addr().Unmap()
				p.mu.Lock()
				fresh := !slices.Contains(p.learned, a)
				if fresh {
					p.learned = append(p.learned, a)
				}
				p.mu.Unlock()
				if fresh {
					p.refreshGateways(r.Context())
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}

func (p *platformAddrs) refreshGateways(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	gws := p.resolveAll(ctx, p.gateways)
	p.mu.Lock()
	gws = append(gws, p.registered...)
	gws = append(gws, p.learned...)
	p.mu.Unlock()
	p.set("gateways", gws)
}

// hostAddrs lists the addresses of this host's interfaces.
func hostAddrs() ([]netip.Addr, error) {
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var as []netip.Addr
	for _, a := range ifs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				as = append(as, ip.Unmap())
			}
		}
	}
	return as, nil
}

// registerGateway keeps this gateway registered in Redis with every address it listens or
// sends from (its URLs, its ext_authz and edge addresses and this host's interfaces), so that
// every node refuses guests' egress to it before it ever calls them, and xds finds its
// ext_authz and its API for the Envoys (authzAddr and edgeAddr, empty for none); it removes
// the registration when ctx ends.
func registerGateway(ctx context.Context, st *store.Store, id string, urls []string, authzAddr, edgeAddr string, log *slog.Logger) {
	beat := func() {
		addrs := slices.Clone(urls)
		for _, a := range []string{authzAddr, edgeAddr} {
			if a != "" {
				addrs = append(addrs, a)
			}
		}
		if as, err := hostAddrs(); err == nil {
			for _, a := range as {
				addrs = append(addrs, a.String())
			}
		}
		bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := st.GatewayHeartbeat(bctx, store.GatewayInfo{ID: id, Addrs: addrs, AuthzAddr: authzAddr, EdgeAddr: edgeAddr}); err != nil {
			log.Warn("gateway heartbeat", "err", err)
		}
	}
	beat()
	tick := time.NewTicker(refreshEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := st.RemoveGateway(rctx, id); err != nil {
				log.Warn("gateway deregister", "err", err)
			}
			return
		case <-tick.C:
			beat()
		}
	}
}

// redisAddrs lists the Redis servers rdb talks to (every node of a Cluster).
func redisAddrs(ctx context.Context, rdb redis.UniversalClient) []string {
	switch c := rdb.(type) {
	case *redis.Client:
		if c.Options().Network == "unix" {
			return nil
		}
		return []string{c.Options().Addr}
	case *redis.ClusterClient:
		addrs := slices.Clone(c.Options().Addrs)
		if slots, err := c.ClusterSlots(ctx).Result(); err == nil {
			for _, s := range slots {
				for _, n := range s.Nodes {
					addrs = append(addrs, n.Addr)
				}
			}
		}
		return addrs
	case *redis.Ring:
		var addrs []string
		for _, a := range c.Options().Addrs {
			addrs = append(addrs, a)
		}
		return addrs
	}
	return nil
}
