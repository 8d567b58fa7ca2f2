package xds

import (
	"encoding/json"
	"log/slog"
	"net"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcxds "google.golang.org/grpc/xds"
	"google.golang.org/protobuf/proto"

	"wb/internal/mtls"
	"wb/internal/mtls/mtlstest"
	"wb/internal/testwait"
)

// TestGRPCClientTLS: with Options.UpstreamTLS, grpc-go's xDS client (our real consumer, as an
// Envoy cannot run here) takes the TLS clusters and calls the nodes over mutual TLS: it is
// sent the clusters with certificate provider instances (GRPCCertProvider, which its
// bootstrap maps to the fleet's files), which is all it accepts, where an Envoy is sent SDS
// secrets. It presents the Envoy role's certificate, which the node requires, and requires
// the node role of wb_nodes' servers: a "node" serving a gateway's certificate of the same
// CA gets no call.
func TestGRPCClientTLS(t *testing.T) {
	ctx := t.Context()
	pki := mtlstest.New(t)
	node := pki.Issue(t, "node", mtlstest.RoleNode)
	notNode := pki.Issue(t, "gateway", mtlstest.RoleGateway)
	good, bad := tlsGRPCNode(t, node.Cert, node.Key, pki.CAFile), tlsGRPCNode(t, notNode.Cert, notNode.Key, pki.CAFile)
	src := &staticSource{f: Fleet{Nodes: []Node{{ID: "node-a", Addr: "https://" + good}, {ID: "node-b", Addr: "https://" + bad}}}}
	// Warnings (a NACK, with the client's reason) go to the test's log.
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := New(ctx, Config{Source: src, Logger: log, Options: Options{UpstreamTLS: UpstreamTLS{
		CertFile: "/etc/wb/envoy.pem", KeyFile: "/etc/wb/envoy-key.pem", CAFile: "/etc/wb/fleet-ca.pem",
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	boot, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri": startServer(t, s), "channel_creds": []any{map[string]string{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]string{"id": "grpc-tls-client"},
		"certificate_providers": map[string]any{GRPCCertProvider: map[string]any{
			"plugin_name": "file_watcher",
			"config": map[string]string{"certificate_file": pki.ClientCert, "private_key_file": pki.ClientKey,
				"ca_certificate_file": pki.CAFile, "refresh_interval": "1s"},
		}},
	})
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting(boot)
	if err != nil {
		t.Fatal(err)
	}
	// The xDS credentials take the TLS of the cluster; a cluster without falls back to
	// plaintext, which the nodes refuse.
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///"+ListenerGRPCNodes, grpc.WithTransportCredentials(creds), grpc.WithResolvers(rb))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	client := healthpb.NewHealthClient(cc)

	testwait.For(t, 60*time.Second, "a call reaches node-a over mutual TLS", func() bool {
		if n := countOf(s, resourcev3.ClusterType, s.metrics.nacks); n > 0 {
			t.Fatalf("the gRPC client rejected the clusters (%v NACKs; see the log)", n)
		}
		return callPeer(ctx, client) == good
	})
	for i := range 20 {
		if p := callPeer(ctx, client); p != good {
			t.Fatalf("call %d: served by %q, want only node-a (%s): node-b's certificate is not of the node role", i, p, good)
		}
	}
}

// tlsGRPCNode is a loopback "node" serving gRPC's health service over mutual TLS with the
// files, to clients of the Envoy role only (as wb node serves --fleet-tls-*).
func tlsGRPCNode(t *testing.T, cert, key, ca string) string {
	t.Helper()
	cfg, err := mtls.Server(mtls.Files{Cert: cert, Key: key, CA: ca}, []string{"h2"}, []string{mtls.RoleEnvoy}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(g, health.NewServer())
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

// TestBuildGRPC: gRPC's xDS clients (by the user agent in their node) get BuildGRPC's
// resources, Envoys Build's; without TLS they are the same, and with it they differ only in
// the clusters' transport sockets (certificate provider instances, no SDS) and the secrets.
func TestBuildGRPC(t *testing.T) {
	for agent, want := range map[string]string{"envoy": fleetKey, "": fleetKey, "gRPC Go": grpcKey, "gRPC Java": grpcKey} {
		if got := (fleetHash{}).ID(&corev3.Node{Id: "x", UserAgentName: agent}); got != want {
			t.Errorf("user agent %q: key %s, want %s", agent, got, want)
		}
	}
	if a, b := goldenJSON(t, Build(fleet3(), Options{})), goldenJSON(t, BuildGRPC(fleet3(), Options{})); string(a) != string(b) {
		t.Errorf("without TLS, BuildGRPC differs from Build:\n%s", firstDiff(string(a), string(b)))
	}
	opts := Options{UpstreamTLS: UpstreamTLS{CertFile: "/etc/wb/envoy.pem", KeyFile: "/etc/wb/envoy-key.pem", CAFile: "/etc/wb/fleet-ca.pem"}}
	envoy, grpcR := Build(fleet3(), opts), BuildGRPC(fleet3(), opts)
	if _, err := grpcR.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if len(grpcR.Secrets) != 0 {
		t.Errorf("gRPC resources with secrets %v", grpcR.Secrets)
	}
	for i, c := range grpcR.Clusters {
		var up tlsv3.UpstreamTlsContext
		if err := c.GetTransportSocket().GetTypedConfig().UnmarshalTo(&up); err != nil {
			t.Fatalf("cluster %s: %v", c.GetName(), err)
		}
		common := up.GetCommonTlsContext()
		v := common.GetValidationContext()
		if common.GetTlsCertificateProviderInstance().GetInstanceName() != GRPCCertProvider ||
			v.GetCaCertificateProviderInstance().GetInstanceName() != GRPCCertProvider || len(v.GetMatchSubjectAltNames()) != 1 ||
			common.GetTlsParams() != nil || len(common.GetTlsCertificateSdsSecretConfigs()) != 0 {
			t.Errorf("cluster %s: %v, want the provider %s and one SAN matcher alone", c.GetName(), common, GRPCCertProvider)
		}
		e := proto.Clone(envoy.Clusters[i]).(*clusterv3.Cluster)
		e.TransportSocket, c = nil, proto.Clone(c).(*clusterv3.Cluster)
		c.TransportSocket = nil
		if !proto.Equal(e, c) {
			t.Errorf("cluster %s differs from Envoy's beyond its transport socket", c.GetName())
		}
	}
}
