package xds

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"wb/session"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// fleet3 is the reviewed fleet of the goldens: three nodes (one draining, one registered
// with a URL as `wb node` does), two gateways (one listening on every interface).
func fleet3() Fleet {
	return Fleet{
		Nodes: []Node{
			{ID: "node-c", Addr: "10.0.0.13:7070", Draining: true},
			{ID: "node-a", Addr: "http://10.0.0.11:7070"},
			{ID: "node/b", Addr: "10.0.0.12:7070"},
		},
		Gateways: []Gateway{
			{ID: "gw_2", HTTPAddr: "http://10.0.1.2:8080", AuthzAddr: "10.0.1.2:9001"},
			{ID: "gw_1", HTTPAddr: "http://10.0.1.1:8080", AuthzAddr: "10.0.1.1:9001"},
		},
	}
}

// TestGolden: the resources of a 3-node fleet pass ValidateAll and Consistent and match the
// reviewed testdata/fleet3.json (go test ./xds -run TestGolden -update rewrites it).
func TestGolden(t *testing.T) {
	r := Build(fleet3(), Options{})
	if len(r.Skipped) > 0 {
		t.Fatalf("skipped: %v", r.Skipped)
	}
	if _, err := r.Snapshot(); err != nil {
		t.Fatal(err)
	}
	got := goldenJSON(t, r)
	path := filepath.Join("testdata", "fleet3.json")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("resources differ from %s (review, then -update):\n%s", path, firstDiff(string(want), string(got)))
	}
}

// goldenJSON is the resources as stable, indented JSON: protojson adds random spaces on
// purpose, so each message is compacted and indented again by encoding/json.
func goldenJSON(t *testing.T, r *Resources) []byte {
	t.Helper()
	enc := func(ms []proto.Message) []json.RawMessage {
		out := []json.RawMessage{}
		for _, m := range ms {
			b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			var c bytes.Buffer
			if err := json.Compact(&c, b); err != nil {
				t.Fatal(err)
			}
			out = append(out, c.Bytes())
		}
		return out
	}
	doc := map[string][]json.RawMessage{
		"listeners": enc(msgs(r.Listeners)), "routes": enc(msgs(r.Routes)),
		"clusters": enc(msgs(r.Clusters)), "endpoints": enc(msgs(r.Endpoints)),
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

func msgs[T proto.Message](in []T) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < min(len(al), len(bl)); i++ {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("lengths %d vs %d lines", len(al), len(bl))
}

func edgeRoute(t *testing.T, r *Resources, name string) *routev3.Route {
	t.Helper()
	for _, rc := range r.Routes {
		for _, vh := range rc.GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				if rt.GetName() == name {
					return rt
				}
			}
		}
	}
	t.Fatalf("route %s not found", name)
	return nil
}

// TestEdgeRoutes: the contract's routes, asserted field by field besides the golden.
func TestEdgeRoutes(t *testing.T) {
	r := Build(fleet3(), Options{})
	pty := edgeRoute(t, r, "pty").GetRoute()
	if u := pty.GetUpgradeConfigs(); len(u) != 1 || u[0].GetUpgradeType() != "websocket" || !u[0].GetEnabled().GetValue() {
		t.Errorf("pty upgrade_configs = %v, want websocket enabled", u)
	}
	if pty.GetTimeout() == nil || pty.GetTimeout().AsDuration() != 0 {
		t.Errorf("pty timeout = %v, want 0s (set, not defaulted)", pty.GetTimeout())
	}
	if pty.GetIdleTimeout().AsDuration() <= 0 || pty.GetMaxStreamDuration().GetMaxStreamDuration().AsDuration() <= 0 {
		t.Errorf("pty idle_timeout %v, max_stream_duration %v: want both set", pty.GetIdleTimeout(), pty.GetMaxStreamDuration())
	}
	for _, name := range []string{"exec", "pty", "files"} {
		if h := edgeRoute(t, r, name).GetRoute().GetClusterHeader(); h != "x-wb-cluster" {
			t.Errorf("%s cluster_header = %q", name, h)
		}
	}
	exec := edgeRoute(t, r, "exec").GetRoute()
	longest := time.Duration(session.ExecTimeoutMaxS) * time.Second
	if d := exec.GetTimeout().AsDuration(); d <= longest {
		t.Errorf("exec timeout %v: must exceed the longest exec %v", d, longest)
	}
	if d := exec.GetIdleTimeout().AsDuration(); d <= longest {
		t.Errorf("exec idle_timeout %v: a silent exec may last %v", d, longest)
	}
	gw := edgeRoute(t, r, "gateway")
	if gw.GetRoute().GetCluster() != ClusterGateway || gw.GetMatch().GetPrefix() != "/v1/" {
		t.Errorf("gateway route = %v", gw)
	}
	var per extauthzv3.ExtAuthzPerRoute
	if err := gw.GetTypedPerFilterConfig()["envoy.filters.http.ext_authz"].UnmarshalTo(&per); err != nil || !per.GetDisabled() {
		t.Errorf("gateway route ext_authz per-route = %v (%v), want disabled", &per, err)
	}
	if !slices.Equal(gw.GetRequestHeadersToRemove(), []string{"x-wb-cluster", "x-wb-edge-auth"}) {
		t.Errorf("gateway route request_headers_to_remove = %v", gw.GetRequestHeadersToRemove())
	}
	if got := r.Routes[0].GetInternalOnlyHeaders(); !slices.Equal(got, []string{"x-wb-cluster", "x-wb-edge-auth"}) {
		t.Errorf("internal_only_headers = %v", got)
	}
	// ext_authz: gRPC to wb_ext_authz, fail closed, no body, route recomputed on x-wb-cluster.
	var hcm hcmv3.HttpConnectionManager
	for _, l := range r.Listeners {
		if l.GetName() == ListenerEdge {
			if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
				t.Fatal(err)
			}
		}
	}
	if hcm.GetRds().GetRouteConfigName() != RouteConfigEdge || len(hcm.GetHttpFilters()) != 2 || hcm.GetHttpFilters()[1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("wb_edge hcm = %v", &hcm)
	}
	var authz extauthzv3.ExtAuthz
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&authz); err != nil {
		t.Fatal(err)
	}
	if authz.GetGrpcService().GetEnvoyGrpc().GetClusterName() != ClusterExtAuthz || authz.GetFailureModeAllow() ||
		authz.GetWithRequestBody() != nil || !authz.GetClearRouteCache() {
		t.Errorf("ext_authz = %v", &authz)
	}
}

// TestNodeClusters: one EDS cluster per node with HTTP health checks on /healthz and outlier
// detection; a draining node's endpoint is DRAINING and leaves wb_nodes.
func TestNodeClusters(t *testing.T) {
	r := Build(fleet3(), Options{})
	byName := map[string]*clusterv3.Cluster{}
	for _, c := range r.Clusters {
		byName[c.GetName()] = c
	}
	for _, id := range []string{"node-a", "node/b", "node-c"} {
		c := byName[NodeCluster(id)]
		if c == nil {
			t.Fatalf("no cluster %s in %v", NodeCluster(id), slices.Collect(mapsKeys(byName)))
		}
		if c.GetType() != clusterv3.Cluster_EDS || c.GetHealthChecks()[0].GetHttpHealthCheck().GetPath() != "/healthz" || c.GetOutlierDetection() == nil {
			t.Errorf("cluster %s = %v", c.GetName(), c)
		}
	}
	for _, cla := range r.Endpoints {
		switch cla.GetClusterName() {
		case "wb_node_node-c":
			if s := cla.GetEndpoints()[0].GetLbEndpoints()[0].GetHealthStatus(); s != corev3.HealthStatus_DRAINING {
				t.Errorf("draining node's endpoint: %v", s)
			}
		case ClusterNodes:
			if n := len(cla.GetEndpoints()[0].GetLbEndpoints()); n != 2 {
				t.Errorf("wb_nodes has %d endpoints, want the 2 serving nodes", n)
			}
		case ClusterGateway, ClusterExtAuthz:
			if n := len(cla.GetEndpoints()[0].GetLbEndpoints()); n != 2 {
				t.Errorf("%s has %d endpoints, want 2", cla.GetClusterName(), n)
			}
		}
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestNodeCluster(t *testing.T) {
	for in, want := range map[string]string{"node_local": "wb_node_node_local", "a/b c": "wb_node_a_b_c", "é.x-1": "wb_node__.x-1"} {
		if got := NodeCluster(in); got != want {
			t.Errorf("NodeCluster(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestChangesTouchOnlyCDSEDS: a node joining changes CDS and EDS only; draining, EDS only; the
// fleet's order changes nothing; the versions depend only on content.
func TestChangesTouchOnlyCDSEDS(t *testing.T) {
	snap := func(f Fleet) [5]string {
		s, err := Build(f, Options{}).Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return versions(s)
	}
	base := snap(fleet3())
	shuffled := fleet3()
	slices.Reverse(shuffled.Nodes)
	slices.Reverse(shuffled.Gateways)
	if v := snap(shuffled); v != base {
		t.Errorf("order changed versions: %v vs %v", v, base)
	}
	joined := fleet3()
	joined.Nodes = append(joined.Nodes, Node{ID: "node-d", Addr: "10.0.0.14:7070"})
	v := snap(joined)
	if v[0] != base[0] || v[1] != base[1] || v[2] == base[2] || v[3] == base[3] {
		t.Errorf("join: versions %v from %v; want LDS and RDS kept, CDS and EDS changed", v, base)
	}
	drained := fleet3()
	drained.Nodes[1].Draining = true
	v = snap(drained)
	if v[0] != base[0] || v[1] != base[1] || v[2] != base[2] || v[3] == base[3] {
		t.Errorf("drain: versions %v from %v; want EDS only changed", v, base)
	}
}

// TestBadAddressesSkipped: addresses come from Redis; a bad one leaves its member out, named
// in Skipped, and the snapshot stays valid. No input panics.
func TestBadAddressesSkipped(t *testing.T) {
	bad := []string{"", "nonsense", "10.0.0.1", "10.0.0.1:0", "10.0.0.1:99999", "node.example:7070",
		"http://[::1", "ftp://10.0.0.1:21", "http://node.example:80", "0.0.0.0:7070", "[fe80::1%eth0]:7070",
		"http://10.0.0.1:7070/path?x", "\x00:1", "[::]:1", "::1:80"}
	for _, addr := range bad {
		f := fleet3()
		f.Nodes = append(f.Nodes, Node{ID: "bad", Addr: addr})
		f.Gateways = append(f.Gateways, Gateway{ID: "gw_bad", HTTPAddr: addr, AuthzAddr: addr})
		r := Build(f, Options{})
		if _, err := r.Snapshot(); err != nil {
			t.Errorf("address %q broke the snapshot: %v", addr, err)
		}
		for _, c := range r.Clusters {
			if c.GetName() == NodeCluster("bad") && !strings.HasPrefix(addr, "http://10.0.0.1:7070") {
				t.Errorf("address %q: node kept", addr)
			}
		}
		if len(r.Skipped) == 0 && addr != "http://10.0.0.1:7070/path?x" {
			t.Errorf("address %q: nothing skipped", addr)
		}
	}
	// Unspecified hosts are skipped, not published: Envoy cannot connect to 0.0.0.0.
	r := Build(Fleet{Nodes: []Node{{ID: "n", Addr: "0.0.0.0:1"}}}, Options{})
	if len(r.Skipped) != 1 {
		t.Errorf("0.0.0.0 kept: %v", r.Skipped)
	}
	// Two ids with one cluster name: the first by id stays.
	r = Build(Fleet{Nodes: []Node{{ID: "a b", Addr: "10.0.0.1:1"}, {ID: "a/b", Addr: "10.0.0.2:1"}}}, Options{})
	if _, err := r.Snapshot(); err != nil || len(r.Skipped) != 1 {
		t.Errorf("colliding ids: %v, skipped %v", err, r.Skipped)
	}
}

// FuzzBuild: whatever Redis holds, Build neither panics nor yields an invalid snapshot.
func FuzzBuild(f *testing.F) {
	f.Add("node-a", "http://10.0.0.1:7070", "http://10.0.1.1:8080", "10.0.1.1:9001", false)
	f.Add("", "", "", "", true)
	f.Add("a/b", "[::1]:1", "http://0.0.0.0:80", "0.0.0.0:1", true)
	f.Add("x", "http://[fe80::1%25eth0]:1", "https://10.0.0.1", "::ffff:10.0.0.1:5", false)
	f.Fuzz(func(t *testing.T, id, addr, httpAddr, authzAddr string, draining bool) {
		fl := fleet3()
		fl.Nodes = append(fl.Nodes, Node{ID: id, Addr: addr, Draining: draining})
		fl.Gateways = append(fl.Gateways, Gateway{ID: id, HTTPAddr: httpAddr, AuthzAddr: authzAddr})
		if _, err := Build(fl, Options{}).Snapshot(); err != nil {
			t.Fatalf("fleet %+v: %v", fl, err)
		}
	})
}

// TestUpstreamTLS: with Options.UpstreamTLS, the ext_authz cluster (ALPN h2, for gRPC), the
// gateway cluster and every node cluster carry a TLS transport socket with the Envoy's
// certificate and key and validation against the fleet's CA and a SAN (for a node's cluster,
// its IP address; for wb_nodes, the node role; for ext_authz and the gateways, the gateway
// role), each one valid, and the gateway
// cluster's endpoints are the gateways' edge addresses (not their public listeners; one
// without is left out). Without it, no cluster has one.
func TestUpstreamTLS(t *testing.T) {
	for _, c := range Build(fleet3(), Options{}).Clusters {
		if c.GetTransportSocket() != nil {
			t.Errorf("without UpstreamTLS, cluster %s has transport socket %v", c.GetName(), c.GetTransportSocket())
		}
	}
	files := UpstreamTLS{CertFile: "/etc/wb/envoy.pem", KeyFile: "/etc/wb/envoy-key.pem", CAFile: "/etc/wb/fleet-ca.pem"}
	opts := Options{UpstreamTLS: files}
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	fleet := fleet3()
	fleet.Gateways[1].EdgeAddr = "10.0.1.1:8443" // gw_1; gw_2 serves no --edge-addr
	r := Build(fleet, opts)
	if _, err := r.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0], "gateway gw_2 http: no --edge-addr") {
		t.Errorf("skipped %q, want gw_2 without an edge address", r.Skipped)
	}
	for _, cla := range r.Endpoints {
		if cla.GetClusterName() != ClusterGateway {
			continue
		}
		eps := cla.GetEndpoints()[0].GetLbEndpoints()
		if sa := eps[0].GetEndpoint().GetAddress().GetSocketAddress(); len(eps) != 1 || sa.GetAddress() != "10.0.1.1" || sa.GetPortValue() != 8443 {
			t.Errorf("wb_gateway endpoints %v, want gw_1's edge address 10.0.1.1:8443 alone", eps)
		}
	}
	nodeIPs := map[string]string{NodeCluster("node-a"): "10.0.0.11", NodeCluster("node/b"): "10.0.0.12", NodeCluster("node-c"): "10.0.0.13"}
	withTLS := 0
	for _, c := range r.Clusters {
		ts := c.GetTransportSocket()
		if ts.GetName() != "envoy.transport_sockets.tls" {
			t.Errorf("cluster %s: transport socket %v, want envoy.transport_sockets.tls", c.GetName(), ts)
			continue
		}
		withTLS++
		var up tlsv3.UpstreamTlsContext
		if err := ts.GetTypedConfig().UnmarshalTo(&up); err != nil {
			t.Fatalf("cluster %s: %v", c.GetName(), err)
		}
		if err := up.ValidateAll(); err != nil {
			t.Errorf("cluster %s: %v", c.GetName(), err)
		}
		// The certificate and the CA come by SDS over ADS (secrets naming the files), for
		// Envoy to read them again when they are rotated; files named in the cluster itself
		// are read once.
		common := up.GetCommonTlsContext()
		if certs := common.GetTlsCertificates(); len(certs) != 0 {
			t.Errorf("cluster %s: inline certificates %v, want them by SDS", c.GetName(), certs)
		}
		if sds := common.GetTlsCertificateSdsSecretConfigs(); len(sds) != 1 || sds[0].GetName() != SecretEnvoyClient || sds[0].GetSdsConfig().GetAds() == nil {
			t.Errorf("cluster %s: certificate SDS %v, want %s by ADS", c.GetName(), sds, SecretEnvoyClient)
		}
		combined := common.GetCombinedValidationContext()
		if sds := combined.GetValidationContextSdsSecretConfig(); sds.GetName() != SecretFleetCA || sds.GetSdsConfig().GetAds() == nil {
			t.Errorf("cluster %s: validation context SDS %v, want %s by ADS", c.GetName(), sds, SecretFleetCA)
		}
		if ca := combined.GetDefaultValidationContext().GetTrustedCa(); ca != nil {
			t.Errorf("cluster %s: inline trusted CA %v, want it by SDS", c.GetName(), ca)
		}
		if common.GetTlsParams().GetTlsMinimumProtocolVersion() != tlsv3.TlsParameters_TLSv1_2 {
			t.Errorf("cluster %s: TLS parameters %v, want at least TLS 1.2", c.GetName(), common.GetTlsParams())
		}
		// A node's cluster also checks that the certificate names the node's IP, as the
		// gateways do: the fleet CA's other certificates do not pass for that node. The
		// others check the role: a node's certificate does not pass for a gateway.
		sans := validationContext(common).GetMatchTypedSubjectAltNames()
		wantType, want := tlsv3.SubjectAltNameMatcher_URI, "spiffe://wb/gateway"
		if ip, isNode := nodeIPs[c.GetName()]; isNode {
			wantType, want = tlsv3.SubjectAltNameMatcher_IP_ADDRESS, ip
		} else if c.GetName() == ClusterNodes {
			want = "spiffe://wb/node"
		}
		if len(sans) != 1 || sans[0].GetSanType() != wantType || sans[0].GetMatcher().GetExact() != want {
			t.Errorf("cluster %s: SAN matchers %v, want the %s %s alone", c.GetName(), sans, wantType, want)
		}
		wantALPN := []string(nil)
		if c.GetName() == ClusterExtAuthz {
			wantALPN = []string{"h2"}
		}
		if got := common.GetAlpnProtocols(); !slices.Equal(got, wantALPN) {
			t.Errorf("cluster %s: ALPN %v, want %v", c.GetName(), got, wantALPN)
		}
	}
	if withTLS != len(r.Clusters) {
		t.Errorf("%d clusters with TLS, want all %d", withTLS, len(r.Clusters))
	}
	checkSecrets(t, r.Secrets, files)

	for _, u := range []UpstreamTLS{{CertFile: "a.pem"}, {CertFile: "a.pem", KeyFile: "k.pem"}, {CAFile: "ca.pem"}} {
		if err := (Options{UpstreamTLS: u}).Validate(); err == nil || !strings.Contains(err.Error(), "all three") {
			t.Errorf("UpstreamTLS %+v: %v, want refused", u, err)
		}
	}
}

// TestUpstreamTLSRoles: with Options.UpstreamTLS, an Envoy accepts, in each cluster, only the
// certificates of the fleet's CA of the member it reaches: a node's certificate (which a
// compromised node host has, with the Redis access to register a "gateway" at its own
// address) does not pass for a gateway or ext_authz, which would be sent callers' API keys,
// nor a gateway's or an Envoy's for a node. The SAN matchers are applied as Envoy does: a
// certificate passes when any one of them matches (or there is none).
func TestUpstreamTLSRoles(t *testing.T) {
	cert := func(role, ip string) *x509.Certificate {
		u, err := url.Parse(role)
		if err != nil {
			t.Fatal(err)
		}
		return &x509.Certificate{URIs: []*url.URL{u}, IPAddresses: []net.IP{net.ParseIP(ip)}}
	}
	nodeA, nodeB := cert("spiffe://wb/node", "10.0.0.11"), cert("spiffe://wb/node", "10.0.0.12")
	gateway, envoy := cert("spiffe://wb/gateway", "10.0.1.1"), cert("spiffe://wb/envoy", "10.0.0.11")
	fleet := fleet3()
	fleet.Gateways[1].EdgeAddr = "10.0.1.1:8443"
	r := Build(fleet, Options{UpstreamTLS: UpstreamTLS{CertFile: "/etc/wb/envoy.pem", KeyFile: "/etc/wb/envoy-key.pem", CAFile: "/etc/wb/fleet-ca.pem"}})
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range r.Clusters {
		clusters[c.GetName()] = c
	}
	for _, c := range []struct {
		cluster string
		cert    *x509.Certificate
		who     string
		ok      bool
	}{
		{ClusterGateway, gateway, "a gateway", true},
		{ClusterGateway, nodeA, "a node", false},
		{ClusterGateway, envoy, "an Envoy", false},
		{ClusterExtAuthz, gateway, "a gateway", true},
		{ClusterExtAuthz, nodeA, "a node", false},
		{ClusterExtAuthz, envoy, "an Envoy", false},
		{NodeCluster("node-a"), nodeA, "node-a", true},
		{NodeCluster("node-a"), nodeB, "node/b", false},
		{ClusterNodes, nodeB, "node/b", true},
		{ClusterNodes, gateway, "a gateway", false},
	} {
		cl := clusters[c.cluster]
		if cl == nil {
			t.Fatalf("no cluster %s", c.cluster)
		}
		var up tlsv3.UpstreamTlsContext
		if err := cl.GetTransportSocket().GetTypedConfig().UnmarshalTo(&up); err != nil {
			t.Fatalf("cluster %s: %v", c.cluster, err)
		}
		if err := up.ValidateAll(); err != nil {
			t.Errorf("cluster %s: %v", c.cluster, err)
		}
		if got := envoyMatchesSAN(validationContext(up.GetCommonTlsContext()), c.cert); got != c.ok {
			t.Errorf("cluster %s: %s's certificate accepted %v, want %v (matchers %v)", c.cluster, c.who, got, c.ok,
				validationContext(up.GetCommonTlsContext()).GetMatchTypedSubjectAltNames())
		}
	}
}

// envoyMatchesSAN applies a validation context's SAN matchers to cert as Envoy does: any one
// that matches accepts it, and none accepts every certificate of the CA. Only exact matchers
// of URI and IP SANs are known here; any other fails the test's caller by matching nothing.
func envoyMatchesSAN(v *tlsv3.CertificateValidationContext, cert *x509.Certificate) bool {
	ms := v.GetMatchTypedSubjectAltNames()
	if len(ms) == 0 {
		return true
	}
	for _, m := range ms {
		exact := m.GetMatcher().GetExact()
		switch m.GetSanType() {
		case tlsv3.SubjectAltNameMatcher_URI:
			for _, u := range cert.URIs {
				if u.String() == exact {
					return true
				}
			}
		case tlsv3.SubjectAltNameMatcher_IP_ADDRESS:
			for _, ip := range cert.IPAddresses {
				if ip.String() == exact {
					return true
				}
			}
		}
	}
	return false
}

// validationContext is the validation context of common that holds the SAN matchers: the
// default one of a combined context (whose SDS secret holds the CA), or the plain one.
func validationContext(common *tlsv3.CommonTlsContext) *tlsv3.CertificateValidationContext {
	if c := common.GetCombinedValidationContext(); c != nil {
		return c.GetDefaultValidationContext()
	}
	return common.GetValidationContext()
}

// checkSecrets: the SDS secrets of Options.UpstreamTLS are valid, name the files on the
// Envoys' hosts (which Envoy reads again when they are rotated: it watches the directories
// of the files an SDS secret names) and hold no bytes of them.
func checkSecrets(t *testing.T, secrets []*tlsv3.Secret, files UpstreamTLS) {
	t.Helper()
	byName := map[string]*tlsv3.Secret{}
	for _, s := range secrets {
		if err := s.ValidateAll(); err != nil {
			t.Errorf("secret %s: %v", s.GetName(), err)
		}
		byName[s.GetName()] = s
	}
	if len(secrets) != 2 {
		t.Errorf("%d secrets, want 2 (%s, %s)", len(secrets), SecretEnvoyClient, SecretFleetCA)
	}
	cert := byName[SecretEnvoyClient].GetTlsCertificate()
	if cert.GetCertificateChain().GetFilename() != files.CertFile || cert.GetPrivateKey().GetFilename() != files.KeyFile ||
		cert.GetWatchedDirectory().GetPath() != filepath.Dir(files.CertFile) {
		t.Errorf("secret %s: %v, want %s and %s, watching %s", SecretEnvoyClient, cert, files.CertFile, files.KeyFile, filepath.Dir(files.CertFile))
	}
	ca := byName[SecretFleetCA].GetValidationContext()
	if ca.GetTrustedCa().GetFilename() != files.CAFile || ca.GetWatchedDirectory().GetPath() != filepath.Dir(files.CAFile) {
		t.Errorf("secret %s: %v, want %s, watching %s", SecretFleetCA, ca, files.CAFile, filepath.Dir(files.CAFile))
	}
}
