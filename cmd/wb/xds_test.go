//go:build linux

package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"wb/xds"
)

// TestEnvoyBootstrap: `wb envoy-bootstrap` prints YAML that parses into a Bootstrap passing
// ValidateAll, explains itself with --help, and refuses incomplete flags.
func TestEnvoyBootstrap(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"envoy-bootstrap", "--node-id", "envoy-1", "--xds", "gateway-1:18000,gateway-2:18000",
		"--tls-ca", "/etc/wb/ca.pem", "--tls-cert", "/etc/wb/envoy.pem", "--tls-key", "/etc/wb/envoy.key", "--admin-port", "9902"}, &out, &errb)
	if err != nil {
		t.Fatalf("%v: %s", err, errb.String())
	}
	b, err := xds.ParseBootstrapYAML(out.Bytes())
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if b.GetNode().GetId() != "envoy-1" || b.GetAdmin().GetAddress().GetSocketAddress().GetPortValue() != 9902 ||
		b.GetAdmin().GetAddress().GetSocketAddress().GetAddress() != "127.0.0.1" ||
		b.GetDynamicResources().GetAdsConfig().GetRateLimitSettings() == nil {
		t.Errorf("bootstrap:\n%s", out.String())
	}

	if !strings.Contains(errb.String(), "--sds-dir") {
		t.Errorf("TLS without --sds-dir: no warning that rotation takes a restart: %q", errb.String())
	}

	// --sds-dir: the SDS files are written there, and the bootstrap reads them.
	sdsDir := t.TempDir()
	out.Reset()
	errb.Reset()
	if err := run(context.Background(), []string{"envoy-bootstrap", "--node-id", "envoy-1", "--xds", "gateway-1:18000", "--sds-dir", sdsDir,
		"--tls-ca", "/etc/wb/ca.pem", "--tls-cert", "/etc/wb/envoy.pem", "--tls-key", "/etc/wb/envoy.key"}, &out, &errb); err != nil {
		t.Fatalf("%v: %s", err, errb.String())
	}
	if _, err := xds.ParseBootstrapYAML(out.Bytes()); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, name := range []string{"wb_xds_client.yaml", "wb_xds_ca.yaml"} {
		path := filepath.Join(sdsDir, name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("SDS file: %v", err)
			continue
		}
		if !strings.Contains(out.String(), "path: "+path) || !strings.Contains(string(b), "/etc/wb/") {
			t.Errorf("%s is not the bootstrap's, or names no certificate file:\n%s", path, b)
		}
	}

	out.Reset()
	errb.Reset()
	if err := run(context.Background(), []string{"envoy-bootstrap", "--help"}, &out, &errb); err != nil && !strings.Contains(err.Error(), "help") {
		t.Fatal(err)
	}
	for _, w := range []string{"-node-id", "-xds", "-tls-ca", "-tls-cert", "-tls-key", "-sds-dir", "-admin-port", "loopback"} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("help lacks %q:\n%s", w, errb.String())
		}
	}
	if err := run(context.Background(), []string{"--help"}, &out, &errb); err != nil || !strings.Contains(out.String(), "envoy-bootstrap") {
		t.Errorf("wb --help lacks envoy-bootstrap (%v)", err)
	}
	for _, args := range [][]string{
		{"envoy-bootstrap", "--xds", "a:1"},
		{"envoy-bootstrap", "--node-id", "e"},
		{"envoy-bootstrap", "--node-id", "e", "--xds", "a:1", "--tls-ca", "ca.pem"},
		{"envoy-bootstrap", "--node-id", "e", "--xds", "a:1", "--admin-port", "0"},
		{"envoy-bootstrap", "--node-id", "e", "--xds", "a:1", "--sds-dir", sdsDir},
	} {
		if err := run(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// TestServeXDSFlags: --xds-tls-* go together, and only with --xds-addr.
func TestServeXDSFlags(t *testing.T) {
	for _, c := range []struct {
		f    xdsFlags
		want string
	}{
		{xdsFlags{certFile: "cert.pem", keyFile: "key.pem", caFile: "ca.pem"}, "apply to --xds-addr, which is not given"},
		{xdsFlags{addr: "127.0.0.1:0", certFile: "cert.pem"}, "give all three or none"},
		{xdsFlags{addr: "127.0.0.1:0", certFile: "cert.pem", keyFile: "key.pem", caFile: "ca.pem"}, "--xds-tls-cert and --xds-tls-key"},
		{xdsFlags{envoy: xds.UpstreamTLS{CertFile: "/etc/wb/envoy.pem", KeyFile: "/etc/wb/envoy-key.pem", CAFile: "/etc/wb/ca.pem"}}, "--envoy-tls-ca apply to --xds-addr"},
		{xdsFlags{addr: "127.0.0.1:0", envoy: xds.UpstreamTLS{CertFile: "/etc/wb/envoy.pem"}}, "--envoy-tls-ca go together"},
	} {
		_, err := listenXDS(t.Context(), c.f, time.Second, nil, nil, nil, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.f, err, c.want)
		}
	}
}

// TestServeXDSEnvoyTLS: --envoy-tls-* become the resources' upstream TLS, whose clusters
// then name the files.
func TestServeXDSEnvoyTLS(t *testing.T) {
	u := xds.UpstreamTLS{CertFile: "/etc/wb/envoy.pem", KeyFile: "/etc/wb/envoy-key.pem", CAFile: "/etc/wb/ca.pem"}
	opts, err := xdsFlags{addr: "127.0.0.1:0", envoy: u}.options()
	if err != nil || opts.UpstreamTLS != u {
		t.Fatalf("options %+v, %v; want upstream TLS %+v", opts, err, u)
	}
	r := xds.Build(xds.Fleet{Nodes: []xds.Node{{ID: "n1", Addr: "https://10.0.0.1:7070"}}}, opts)
	for _, c := range r.Clusters {
		if c.GetTransportSocket().GetName() != "envoy.transport_sockets.tls" {
			t.Errorf("cluster %s: transport socket %v, want TLS", c.GetName(), c.GetTransportSocket())
		}
	}
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"serve", "--help"}, &out, &errb); err != nil && !strings.Contains(err.Error(), "help") {
		t.Fatal(err)
	}
	for _, w := range []string{"-envoy-tls-cert", "-envoy-tls-key", "-envoy-tls-ca", "Envoys' hosts"} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("wb serve --help lacks %q", w)
		}
	}
}

// TestServeXDS: `wb serve --xds-addr` serves ADS, and the gateway cluster's endpoints are the
// gateway's own registered address.
func TestServeXDS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	env := startServe(t, "--xds-addr", addr)
	u, err := url.Parse(env["WB_URL"])
	if err != nil {
		t.Fatal(err)
	}

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "envoy-test"}
	req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{xds.ClusterGateway}}
	for {
		if err := ads.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := ads.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var cla endpointv3.ClusterLoadAssignment
		if err := resp.GetResources()[0].UnmarshalTo(&cla); err != nil {
			t.Fatal(err)
		}
		for _, loc := range cla.GetEndpoints() {
			for _, ep := range loc.GetLbEndpoints() {
				sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
				if sa.GetAddress() == u.Hostname() && strconv.Itoa(int(sa.GetPortValue())) == u.Port() {
					checkXDSMetrics(t, env)
					return
				}
			}
		}
		// The gateway registers itself right after starting: wait for the next version.
		// (An ACK with the current version waits for a new snapshot.)
		req = &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{xds.ClusterGateway},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	}
}

// checkXDSMetrics: the xDS server's metrics are on the gateway's /metrics.
func checkXDSMetrics(t *testing.T, env map[string]string) {
	t.Helper()
	req, _ := http.NewRequest("GET", env["WB_URL"]+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+env["WB_ADMIN_KEY"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "wb_xds_snapshots_published_total") || !strings.Contains(string(body), "wb_xds_responses_total") {
		t.Errorf("/metrics lacks the xds metrics:\n%.2000s", body)
	}
}
