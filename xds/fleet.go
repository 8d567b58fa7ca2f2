package xds

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"wb/internal/edgeauth"
	"wb/store"
)

// Envoy names that the gateway's ext_authz, the goldens and the operators' dashboards share.
const (
	ListenerEdge    = "wb_edge"
	RouteConfigEdge = "wb_routes"
	ClusterGateway  = "wb_gateway"
	ClusterExtAuthz = "wb_ext_authz"
	// ListenerGRPCNodes is the gRPC-facing API listener: a gRPC xDS client that dials
	// xds:///wb_grpc_nodes reaches any serving node, round robin, through ClusterNodes. It is
	// how the tests check our resources with an independent consumer (grpc-go), and it lets a
	// future in-fleet gRPC caller reach the nodes without a proxy.
	ListenerGRPCNodes = "wb_grpc_nodes"
	// ClusterNodes holds every node that is not draining (the gRPC listener's only cluster).
	ClusterNodes = "wb_nodes"
	// SecretEnvoyClient and SecretFleetCA are the SDS secrets of Options.UpstreamTLS: the
	// Envoys' client certificate and key, and the fleet's CA.
	SecretEnvoyClient = "wb_envoy_client"
	SecretFleetCA     = "wb_fleet_ca"
	// GRPCCertProvider is the certificate provider instance of BuildGRPC's TLS clusters,
	// which a gRPC xDS client's bootstrap defines (certificate_providers): the client
	// certificate and key of the Envoy role and the fleet's CA.
	GRPCCertProvider = "wb_fleet"
)

// NodeCluster is the Envoy cluster of one node: "wb_node_" and the node id with every
// character outside [A-Za-z0-9_.-] replaced by "_". ext_authz sets x-wb-cluster to it; both
// take it from edgeauth, so they cannot disagree.
func NodeCluster(nodeID string) string { return edgeauth.NodeCluster(nodeID) }

// Fleet is what the resources are built from: the registered gateways and nodes.
type Fleet struct {
	Gateways []Gateway
	Nodes    []Node
}

// Gateway is one gateway replica: where its HTTP API and its ext_authz gRPC service listen,
// as host:port or URLs. Either may be empty.
type Gateway struct {
	ID        string
	HTTPAddr  string
	AuthzAddr string
	// EdgeAddr is where it serves its API to the Envoys over mutual TLS (wb serve
	// --edge-addr): the wb_gateway endpoint when the Envoys speak TLS (Options.UpstreamTLS),
	// in place of HTTPAddr, the public listener, which cannot require client certificates.
	EdgeAddr string
}

// Node is one `wb node`: its data-path address (host:port or URL) and whether it drains.
type Node struct {
	ID       string
	Addr     string
	Draining bool
}

// FleetFrom turns the store's registrations into a Fleet. A gateway's HTTP address is the
// first http(s) URL among its Addrs (registerGateway lists its listen URL first); an
// unspecified host there (0.0.0.0, ::) stands for this gateway's first non-loopback interface
// address of the same family, also listed in Addrs. Heartbeat times and usage are left out,
// so that they never change the resources.
func FleetFrom(nodes []store.NodeInfo, gateways []store.GatewayInfo) Fleet {
	var f Fleet
	for _, n := range nodes {
		f.Nodes = append(f.Nodes, Node{ID: n.ID, Addr: n.Addr, Draining: n.Draining})
	}
	for _, g := range gateways {
		gw := Gateway{ID: g.ID, AuthzAddr: resolveUnspecified(g.AuthzAddr, g.Addrs), EdgeAddr: resolveUnspecified(g.EdgeAddr, g.Addrs)}
		for _, a := range g.Addrs {
			if strings.HasPrefix(a, "http://") || strings.HasPrefix(a, "https://") {
				gw.HTTPAddr = resolveUnspecified(a, g.Addrs)
				break
			}
		}
		f.Gateways = append(f.Gateways, gw)
	}
	return f
}

// resolveUnspecified replaces an unspecified host in addr by the first non-loopback address
// of the same family in addrs; it answers addr unchanged otherwise.
func resolveUnspecified(addr string, addrs []string) string {
	ap, err := parseHostPort(addr)
	if err != nil || !ap.Addr().IsUnspecified() {
		return addr
	}
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a)
		if err == nil && !ip.IsLoopback() && !ip.IsUnspecified() && !ip.IsLinkLocalUnicast() && ip.Is4() == ap.Addr().Is4() {
			return netip.AddrPortFrom(ip, ap.Port()).String()
		}
	}
	return addr
}

// parseAddr reads host:port or an http(s) URL whose host is an IP literal: EDS endpoints
// must be IP addresses, and Envoy cannot connect to an unspecified one.
func parseAddr(s string) (netip.AddrPort, error) {
	ap, err := parseHostPort(s)
	if err == nil && ap.Addr().IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("address %q: unspecified host; register a reachable IP", s)
	}
	return ap, err
}

func parseHostPort(s string) (netip.AddrPort, error) {
	hostport := s
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("address %q: %w", s, err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return netip.AddrPort{}, fmt.Errorf("address %q: scheme must be http or https", s)
		}
		hostport = u.Host
		if u.Port() == "" {
			port := "80"
			if u.Scheme == "https" {
				port = "443"
			}
			hostport = u.Host + ":" + port
		}
	}
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: want IP:port or an http(s) URL with an IP host: %w", s, err)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("address %q: port 0", s)
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("address %q: zoned addresses are not routable from Envoy", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// parsedNode is a node whose address parsed.
type parsedNode struct {
	id, cluster string
	addr        netip.AddrPort
	draining    bool
}

// parseFleet keeps the members whose addresses parse, in id order, and says why it left each
// other one out. Two nodes whose ids map to one cluster name keep the first (by id). With
// edgeTLS, a gateway's HTTP endpoint is its EdgeAddr, and one without is left out.
func parseFleet(f Fleet, edgeTLS bool) (nodes []parsedNode, gwHTTP, gwAuthz []netip.AddrPort, skipped []string) {
	ns := slices.Clone(f.Nodes)
	slices.SortFunc(ns, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	seen := map[string]string{}
	for _, n := range ns {
		if n.ID == "" {
			skipped = append(skipped, fmt.Sprintf("node with address %q: empty id", n.Addr))
			continue
		}
		ap, err := parseAddr(n.Addr)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("node %s: %v", n.ID, err))
			continue
		}
		c := NodeCluster(n.ID)
		if other, dup := seen[c]; dup {
			skipped = append(skipped, fmt.Sprintf("node %s: cluster name %s already taken by node %s", n.ID, c, other))
			continue
		}
		seen[c] = n.ID
		nodes = append(nodes, parsedNode{id: n.ID, cluster: c, addr: ap, draining: n.Draining})
	}
	gs := slices.Clone(f.Gateways)
	slices.SortFunc(gs, func(a, b Gateway) int { return strings.Compare(a.ID, b.ID) })
	for _, g := range gs {
		httpAddr := g.HTTPAddr
		if edgeTLS {
			httpAddr = g.EdgeAddr
			if httpAddr == "" {
				skipped = append(skipped, fmt.Sprintf("gateway %s http: no --edge-addr, and the Envoys speak TLS to the gateways (--envoy-tls-*)", g.ID))
			}
		}
		if httpAddr != "" {
			if ap, err := parseAddr(httpAddr); err != nil {
				skipped = append(skipped, fmt.Sprintf("gateway %s http: %v", g.ID, err))
			} else {
				gwHTTP = append(gwHTTP, ap)
			}
		}
		if g.AuthzAddr != "" {
			if ap, err := parseAddr(g.AuthzAddr); err != nil {
				skipped = append(skipped, fmt.Sprintf("gateway %s authz: %v", g.ID, err))
			} else {
				gwAuthz = append(gwAuthz, ap)
			}
		}
	}
	return nodes, dedupe(gwHTTP), dedupe(gwAuthz), skipped
}

// dedupe drops repeated addresses (two registrations of one gateway), which gRPC clients
// reject in one assignment.
func dedupe(as []netip.AddrPort) []netip.AddrPort {
	slices.SortFunc(as, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(as)
}
