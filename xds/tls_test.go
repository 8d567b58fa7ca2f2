package xds

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// TestServeTLS: with ServerTLS (wb serve --xds-tls-*), ADS is served only over TLS and only to
// a client whose certificate the client CA signed, as wb envoy-bootstrap --tls-* sets an Envoy
// up; plaintext, no certificate and another CA's certificate get nothing.
func TestServeTLS(t *testing.T) {
	pki := newTestPKI(t)
	addr := startTLSServer(t, pki.serverCert, pki.serverKey, pki.caFile)
	withTLS := func(certs ...tls.Certificate) grpc.DialOption { return pki.dialOption(certs...) }
	clusters := func(creds grpc.DialOption) (int, error) { return adsClusters(t, addr, creds) }

	if n, err := clusters(withTLS(pki.client)); err != nil || n != 6 {
		t.Fatalf("an Envoy with the CA's client certificate: %d clusters, %v; want 6", n, err)
	}
	for _, c := range []struct {
		name  string
		creds grpc.DialOption
	}{
		{"plaintext", grpc.WithTransportCredentials(insecure.NewCredentials())},
		{"TLS without a client certificate", withTLS()},
		{"a client certificate from another CA", withTLS(pki.otherClient)},
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
	before, after := newTestPKI(t), newTestPKI(t)
	dir := t.TempDir()
	cert, key, ca := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "ca.pem")
	install := func(p testPKI, age time.Duration) {
		for src, dst := range map[string]string{p.serverCert: cert, p.serverKey: key, p.caFile: ca} {
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
	if n, err := adsClusters(t, addr, before.dialOption(before.client)); err != nil || n != 6 {
		t.Fatalf("before the rotation: %d clusters, %v; want 6", n, err)
	}

	install(after, 0)
	if n, err := adsClusters(t, addr, after.dialOption(after.client)); err != nil || n != 6 {
		t.Fatalf("after the rotation, an Envoy of the new CA: %d clusters, %v; want 6 (the files were not read again)", n, err)
	}
	if n, err := adsClusters(t, addr, before.dialOption(before.client)); err == nil {
		t.Errorf("after the rotation, an Envoy of the old CA got %d clusters, want refused", n)
	}

	if err := os.WriteFile(key, []byte("half written"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := adsClusters(t, addr, after.dialOption(after.client)); err != nil || n != 6 {
		t.Errorf("with a broken key file: %d clusters, %v; want the last good files served", n, err)
	}
}

// startTLSServer serves fleet3 over ADS with ServerTLS of the files, and answers its address.
func startTLSServer(t *testing.T, cert, key, ca string) string {
	t.Helper()
	cfg, err := ServerTLS(cert, key, ca, nil)
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
func (p testPKI) dialOption(certs ...tls.Certificate) grpc.DialOption {
	roots := x509.NewCertPool()
	roots.AddCert(p.ca)
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: certs, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}))
}

// TestServerTLSErrors: ServerTLS names the flag at fault.
func TestServerTLSErrors(t *testing.T) {
	pki := newTestPKI(t)
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cert, key, ca, want string
	}{
		{pki.serverCert, pki.serverKey, "", "give all three or none"},
		{"", pki.serverKey, pki.caFile, "give all three or none"},
		{pki.serverCert, pki.caFile, pki.caFile, "--xds-tls-cert and --xds-tls-key"},
		{pki.serverCert, pki.serverKey, filepath.Join(t.TempDir(), "missing.pem"), "--xds-tls-client-ca"},
		{pki.serverCert, pki.serverKey, notPEM, "no PEM certificate"},
	} {
		_, err := ServerTLS(c.cert, c.key, c.ca, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ServerTLS(%q, %q, %q) = %v, want an error with %q", c.cert, c.key, c.ca, err, c.want)
		}
	}
}

// testPKI is a CA with a server certificate for 127.0.0.1 and a client certificate, and a
// client certificate of another CA.
type testPKI struct {
	ca                            *x509.Certificate
	caFile, serverCert, serverKey string
	client, otherClient           tls.Certificate
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	sign := func(tpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) []byte {
		tpl.NotBefore, tpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tpl, parent, pub, signer)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		k := newKey()
		tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		der := sign(tpl, tpl, &k.PublicKey, k)
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c, k, der
	}
	leaf := func(ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage, ips ...net.IP) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		return sign(&x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "leaf"}, IPAddresses: ips,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature}, ca, &k.PublicKey, caKey), k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pair := func(der []byte, k *ecdsa.PrivateKey) tls.Certificate {
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	}
	ca, caKey, caDER := newCA("wb test CA")
	other, otherKey, _ := newCA("someone else's CA")
	srvDER, srvKey := leaf(ca, caKey, x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	cliDER, cliKey := leaf(ca, caKey, x509.ExtKeyUsageClientAuth)
	otherDER, otherCliKey := leaf(other, otherKey, x509.ExtKeyUsageClientAuth)
	return testPKI{
		ca:          ca,
		caFile:      write("ca.pem", "CERTIFICATE", caDER),
		serverCert:  write("server.pem", "CERTIFICATE", srvDER),
		serverKey:   write("server-key.pem", "EC PRIVATE KEY", keyDER(srvKey)),
		client:      pair(cliDER, cliKey),
		otherClient: pair(otherDER, otherCliKey),
	}
}
