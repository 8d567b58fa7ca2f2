package xds

import (
	"crypto/x509"
	"encoding/json"
	"maps"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

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

// TestBootstrapSDS: with SDSDir, the xDS cluster takes its client certificate and CA by SDS
// from files in SDSDir (path_config_source), which BootstrapSecrets writes: one valid Secret
// each, of the names the cluster asks for, naming the certificate files (Envoy watches their
// directory and reads a rotated certificate again; the files named in a static cluster itself
// are read once). The gateway role is still required of the xDS servers.
func TestBootstrapSDS(t *testing.T) {
	o := BootstrapOptions{NodeID: "envoy-1", XDS: "gw1:9002", SDSDir: "/etc/envoy",
		CAFile: "/etc/wb/ca/ca.pem", CertFile: "/etc/wb/tls/envoy.pem", KeyFile: "/etc/wb/tls/envoy-key.pem"}
	y, err := BootstrapYAML(o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseBootstrapYAML(y)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	var tc tlsv3.UpstreamTlsContext
	if err := b.GetStaticResources().GetClusters()[0].GetTransportSocket().GetTypedConfig().UnmarshalTo(&tc); err != nil {
		t.Fatal(err)
	}
	common := tc.GetCommonTlsContext()
	if len(common.GetTlsCertificates()) != 0 || common.GetValidationContext() != nil {
		t.Errorf("inline files left in the xDS cluster: %v", common)
	}
	wantPaths := map[string]string{}
	certSDS := common.GetTlsCertificateSdsSecretConfigs()
	if len(certSDS) != 1 {
		t.Fatalf("certificate SDS %v, want one", certSDS)
	}
	caSDS := common.GetCombinedValidationContext().GetValidationContextSdsSecretConfig()
	for _, sds := range []*tlsv3.SdsSecretConfig{certSDS[0], caSDS} {
		p := sds.GetSdsConfig().GetPathConfigSource().GetPath()
		if sds.GetName() == "" || filepath.Dir(p) != o.SDSDir {
			t.Errorf("SDS %v: want a secret from a file in %s", sds, o.SDSDir)
		}
		wantPaths[filepath.Base(p)] = sds.GetName()
	}
	def := common.GetCombinedValidationContext().GetDefaultValidationContext()
	u, _ := url.Parse(mtls.RoleNode)
	if sans := def.GetMatchTypedSubjectAltNames(); len(sans) != 1 || sans[0].GetMatcher().GetExact() != mtls.RoleGateway ||
		envoyMatchesSAN(def, &x509.Certificate{URIs: []*url.URL{u}}) {
		t.Errorf("xDS cluster's SAN matchers %v, want exactly the URI %s", sans, mtls.RoleGateway)
	}

	files, err := BootstrapSecrets(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(wantPaths) {
		t.Errorf("secret files %v, want %v", slices.Sorted(maps.Keys(files)), wantPaths)
	}
	var secrets []*tlsv3.Secret
	for name, content := range files {
		var resp discoveryv3.DiscoveryResponse
		if err := protojson.Unmarshal(yamlToJSON(t, content), &resp); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, content)
		}
		// Envoy takes exactly one secret from a file, of the name asked for.
		if len(resp.GetResources()) != 1 {
			t.Fatalf("%s: %d resources, want 1", name, len(resp.GetResources()))
		}
		var s tlsv3.Secret
		if err := resp.GetResources()[0].UnmarshalTo(&s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := s.ValidateAll(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if want, ok := wantPaths[name]; !ok || s.GetName() != want {
			t.Errorf("%s holds secret %q; the bootstrap reads %v", name, s.GetName(), wantPaths)
		}
		secrets = append(secrets, &s)
	}
	for _, s := range secrets {
		if c := s.GetTlsCertificate(); c != nil && (c.GetCertificateChain().GetFilename() != o.CertFile ||
			c.GetPrivateKey().GetFilename() != o.KeyFile || c.GetWatchedDirectory().GetPath() != "/etc/wb/tls") {
			t.Errorf("secret %s: %v, want %s and %s watched in /etc/wb/tls", s.GetName(), c, o.CertFile, o.KeyFile)
		}
		if v := s.GetValidationContext(); v != nil && (v.GetTrustedCa().GetFilename() != o.CAFile || v.GetWatchedDirectory().GetPath() != "/etc/wb/ca") {
			t.Errorf("secret %s: %v, want %s watched in /etc/wb/ca", s.GetName(), v, o.CAFile)
		}
	}

	for _, bad := range []BootstrapOptions{
		{NodeID: "e", XDS: "a:1", SDSDir: "/etc/envoy"}, // SDS without TLS
		{NodeID: "e", XDS: "a:1", SDSDir: "relative", CAFile: "ca", CertFile: "c", KeyFile: "k"},
	} {
		if _, err := Bootstrap(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
		if _, err := BootstrapSecrets(bad); err == nil {
			t.Errorf("BootstrapSecrets(%+v): no error", bad)
		}
	}
}

func yamlToJSON(t *testing.T, y []byte) []byte {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(y, &v); err != nil {
		t.Fatal(err)
	}
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return j
}
