package xds

import (
	"crypto/x509"
	"net"
	"net/url"
	"strings"
	"testing"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"wb/internal/mtls"
)

// TestBootstrap: the YAML parses back into a Bootstrap that passes ValidateAll, with ADS
// over gRPC and rate limits, LDS and CDS by ADS, admin on loopback, TLS when asked.
func TestBootstrap(t *testing.T) {
	y, err := BootstrapYAML(BootstrapOptions{NodeID: "123", XDS: "gw1:9002, 10.0.0.2:9002",
		CAFile: "/etc/wb/ca.pem", CertFile: "/etc/wb/envoy.pem", KeyFile: "/etc/wb/envoy-key.pem"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseBootstrapYAML(y)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	ads := b.GetDynamicResources().GetAdsConfig()
	if b.GetNode().GetId() != "123" || ads.GetApiType().String() != "GRPC" || ads.GetRateLimitSettings().GetMaxTokens() == nil ||
		ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != ClusterXDS {
		t.Errorf("node/ads: %v %v", b.GetNode(), ads)
	}
	if b.GetDynamicResources().GetLdsConfig().GetAds() == nil || b.GetDynamicResources().GetCdsConfig().GetAds() == nil {
		t.Error("lds/cds not by ADS")
	}
	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" || a.GetPortValue() != 9901 {
		t.Errorf("admin on %v", a)
	}
	xds := b.GetStaticResources().GetClusters()[0]
	if n := len(xds.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()); n != 2 {
		t.Errorf("%d xDS servers, want 2", n)
	}
	var tc tlsv3.UpstreamTlsContext
	if err := xds.GetTransportSocket().GetTypedConfig().UnmarshalTo(&tc); err != nil || tc.GetSni() != "gw1" ||
		tc.GetCommonTlsContext().GetValidationContext().GetTrustedCa().GetFilename() != "/etc/wb/ca.pem" {
		t.Errorf("tls: %v (%v)", &tc, err)
	}
	// The xDS servers are the gateways (wb serve --xds-addr), serving with a gateway's
	// certificate: only that role, exactly, as the other clusters check theirs.
	sans := tc.GetCommonTlsContext().GetValidationContext().GetMatchTypedSubjectAltNames()
	if len(sans) != 1 || sans[0].GetSanType() != tlsv3.SubjectAltNameMatcher_URI || sans[0].GetMatcher().GetExact() != mtls.RoleGateway {
		t.Errorf("xDS cluster's SAN matchers %v, want exactly the URI %s", sans, mtls.RoleGateway)
	}
	for _, c := range []struct {
		role string
		ok   bool
	}{{mtls.RoleGateway, true}, {mtls.RoleNode, false}, {mtls.RoleEnvoy, false}} {
		u, _ := url.Parse(c.role)
		cert := &x509.Certificate{URIs: []*url.URL{u}, IPAddresses: []net.IP{net.ParseIP("10.0.0.2")}}
		if got := envoyMatchesSAN(tc.GetCommonTlsContext().GetValidationContext(), cert); got != c.ok {
			t.Errorf("xDS cluster: a certificate of %s accepted %v, want %v", c.role, got, c.ok)
		}
	}
	if strings.Contains(string(y), `{"`) {
		t.Errorf("flow style left in the YAML:\n%s", y)
	}

	for _, bad := range []BootstrapOptions{
		{XDS: "a:1"}, {NodeID: "e"}, {NodeID: "e", XDS: "nohost"}, {NodeID: "e", XDS: "a:0"},
		{NodeID: "e", XDS: "a:1", CAFile: "ca"}, {NodeID: "e", XDS: "a:1", AdminPort: 70000},
	} {
		if _, err := Bootstrap(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
