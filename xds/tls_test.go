package xds

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"wb/internal/mtls/mtlstest"
)

// TestServeTLS: with ServerTLS (wb serve --xds-tls-*), ADS is served only over TLS and only to
// a client whose certificate the client CA signed and names the Envoy role, as wb
// envoy-bootstrap --tls-* sets an Envoy up; plaintext, no certificate, another CA's
// certificate and one of the CA for another role (a node's or a gateway's: the resources name
// every member of the fleet) get nothing.
func TestServeTLS(t *testing.T) {
	pki := mtlstest.New(t)
	addr := startTLSServer(t, pki.Cert, pki.Key, pki.CAFile)
	withTLS := func(certs ...tls.Certificate) grpc.DialOption { return dialOption(pki, certs...) }
	clusters := func(creds grpc.DialOption) (int, error) { return adsClusters(t, addr, creds) }

	if n, err := clusters(withTLS(pki.Client)); err != nil || n != 6 {
		t.Fatalf("an Envoy with the CA's client certificate: %d clusters, %v; want 6", n, err)
	}
	for _, c := range []struct {
		name  string
		creds grpc.DialOption
	}{
		{"plaintext", grpc.WithTransportCredentials(insecure.NewCredentials())},
		{"TLS without a client certificate", withTLS()},
		{"a client certificate from another CA", withTLS(pki.Other)},
		{"a node's certificate of the CA", withTLS(pki.Issue(t, "node", mtlstest.RoleNode).Pair)},
		{"a gateway's certificate of the CA", withTLS(pki.Issue(t, "gateway", mtlstest.RoleGateway).Pair)},
		{"a certificate of the CA of no role", withTLS(pki.Issue(t, "none").Pair)},
	} {
		if n, err := clusters(c.creds); err == nil {
			t.Errorf("%s: got %d clusters, want refused", c.name, n)
		}
	}
}

// TestServeTLSRotation: certificate, key and client CA files replaced in place (as
// cert-manager or a Vault agent rotates them) serve the next connection without a restart;
// files that do not load keep the last good ones.
func TestServeTLSRotation(t *testing.T) {
	before, after := mtlstest.New(t), mtlstest.New(t)
	dir := t.TempDir()
	cert, key, ca := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "ca.pem")
	install := func(p mtlstest.PKI, age time.Duration) {
		for src, dst := range map[string]string{p.Cert: cert, p.Key: key, p.CAFile: ca} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o600); err != nil {
				t.Fatal(err)
			}
			// Distinct times, whatever the file system's clock resolution.
			at := time.Now().Add(age)
			if err := os.Chtimes(dst, at, at); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(before, -time.Hour)
	addr := startTLSServer(t, cert, key, ca)
	if n, err := adsClusters(t, addr, dialOption(before, before.Client)); err != nil || n != 6 {
		t.Fatalf("before the rotation: %d clusters, %v; want 6", n, err)
	}

	install(after, 0)
	if n, err := adsClusters(t, addr, dialOption(after, after.Client)); err != nil || n != 6 {
		t.Fatalf("after the rotation, an Envoy of the new CA: %d clusters, %v; want 6 (the files were not read again)", n, err)
	}
	if n, err := adsClusters(t, addr, dialOption(before, before.Client)); err == nil {
		t.Errorf("after the rotation, an Envoy of the old CA got %d clusters, want refused", n)
	}

	if err := os.WriteFile(key, []byte("half written"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := adsClusters(t, addr, dialOption(after, after.Client)); err != nil || n != 6 {
		t.Errorf("with a broken key file: %d clusters, %v; want the last good files served", n, err)
	}
}

// startTLSServer serves fleet3 over ADS with ServerTLS of the files, and answers its address.
func startTLSServer(t *testing.T, cert, key, ca string) string {
	t.Helper()
	cfg, err := ServerTLS(cert, key, ca, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(t.Context(), Config{Source: &staticSource{f: fleet3()}, TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	return startServer(t, s)
}

// adsClusters asks addr for the clusters over an ADS stream, and answers how many came.
func adsClusters(t *testing.T, addr string, creds grpc.DialOption) (int, error) {
	cc, err := grpc.NewClient(addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return 0, err
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy-1"}, TypeUrl: resourcev3.ClusterType}); err != nil {
		return 0, err
	}
	resp, err := st.Recv()
	if err != nil {
		return 0, err
	}
	return len(resp.GetResources()), nil
}

// dialOption is TLS trusting p's CA, presenting certs.
func dialOption(p mtlstest.PKI, certs ...tls.Certificate) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(p.ClientConfig(certs...)))
}

// TestServerTLSErrors: ServerTLS names the flag at fault.
func TestServerTLSErrors(t *testing.T) {
	pki := mtlstest.New(t)
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cert, key, ca, want string
	}{
		{pki.Cert, pki.Key, "", "give all three or none"},
		{"", pki.Key, pki.CAFile, "give all three or none"},
		{pki.Cert, pki.CAFile, pki.CAFile, "--xds-tls-cert and --xds-tls-key"},
		{pki.Cert, pki.Key, filepath.Join(t.TempDir(), "missing.pem"), "--xds-tls-client-ca"},
		{pki.Cert, pki.Key, notPEM, "no PEM certificate"},
	} {
		_, err := ServerTLS(c.cert, c.key, c.ca, nil, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ServerTLS(%q, %q, %q) = %v, want an error with %q", c.cert, c.key, c.ca, err, c.want)
		}
	}
}

// TestSecretsOverADS: with Options.UpstreamTLS, the ADS stream that sends an Envoy the TLS
// clusters answers the SDS secrets they name, valid, naming the files on the Envoys' hosts
// (Envoy watches the directories of the files an SDS secret names, and reads a rotated
// certificate again; files named in a cluster are read once).
func TestSecretsOverADS(t *testing.T) {
	files := UpstreamTLS{CertFile: "/etc/wb/tls/envoy.pem", KeyFile: "/etc/wb/tls/envoy-key.pem", CAFile: "/etc/wb/ca/fleet-ca.pem"}
	s, err := New(t.Context(), Config{Source: &staticSource{f: fleet3()}, Options: Options{UpstreamTLS: files}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(startServer(t, s), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy-1"}, TypeUrl: resourcev3.SecretType,
		ResourceNames: []string{SecretEnvoyClient, SecretFleetCA}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var secrets []*tlsv3.Secret
	for _, a := range resp.GetResources() {
		var sec tlsv3.Secret
		if err := a.UnmarshalTo(&sec); err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, &sec)
	}
	if resp.GetVersionInfo() == "" {
		t.Error("secrets sent without a version")
	}
	checkSecrets(t, secrets, files)
}
