// Package mtlstest makes the certificates that mutual TLS tests need: a CA, certificates
// for 127.0.0.1 signed by it with the fleet's roles (URI SANs), and a client certificate of
// another CA.
package mtlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The roles a certificate names, as URI SANs: the same as package mtls's Role constants
// (mtlstest cannot import mtls, whose own tests import mtlstest).
const (
	RoleNode    = "spiffe://wb/node"
	RoleGateway = "spiffe://wb/gateway"
	RoleEnvoy   = "spiffe://wb/envoy"
)

// PKI is a CA (CA, in CAFile) with a certificate for 127.0.0.1 that serves and dials (Cert
// and Key files, Member) of the node and gateway roles, a client certificate of the Envoy
// role (Client, also in ClientCert and ClientKey), and a client certificate of another CA
// (Other, also in OtherCert and OtherKey), of every role. Issue makes more, of chosen roles.
type PKI struct {
	CA                    *x509.Certificate
	CAFile                string
	Cert, Key             string
	ClientCert, ClientKey string
	OtherCert, OtherKey   string
	Member, Client, Other tls.Certificate

	caKey *ecdsa.PrivateKey
	dir   string
}

// Leaf is a certificate Issue made: its files, and the pair.
type Leaf struct {
	Cert, Key string
	Pair      tls.Certificate
}

// New writes a fresh PKI in a temporary directory of t.
func New(t testing.TB) PKI {
	t.Helper()
	dir := t.TempDir()
	ca, caKey, caDER := newCA(t, "wb test CA")
	other, otherKey, _ := newCA(t, "someone else's CA")
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	memDER, memKey := leaf(t, ca, caKey, both, []string{RoleNode, RoleGateway}, net.IPv4(127, 0, 0, 1))
	cliDER, cliKey := leaf(t, ca, caKey, client, []string{RoleEnvoy})
	otherDER, otherCliKey := leaf(t, other, otherKey, client, []string{RoleNode, RoleGateway, RoleEnvoy})
	return PKI{
		CA:         ca,
		CAFile:     write(t, dir, "ca.pem", "CERTIFICATE", caDER),
		Cert:       write(t, dir, "member.pem", "CERTIFICATE", memDER),
		Key:        write(t, dir, "member-key.pem", "EC PRIVATE KEY", keyDER(t, memKey)),
		ClientCert: write(t, dir, "client.pem", "CERTIFICATE", cliDER),
		ClientKey:  write(t, dir, "client-key.pem", "EC PRIVATE KEY", keyDER(t, cliKey)),
		OtherCert:  write(t, dir, "other.pem", "CERTIFICATE", otherDER),
		OtherKey:   write(t, dir, "other-key.pem", "EC PRIVATE KEY", keyDER(t, otherCliKey)),
		Member:     pair(memDER, memKey),
		Client:     pair(cliDER, cliKey),
		Other:      pair(otherDER, otherCliKey),
		caKey:      caKey,
		dir:        dir,
	}
}

// Issue makes a certificate of the CA for 127.0.0.1, that serves and dials, naming roles
// (URI SANs such as RoleNode; none for a certificate of no role), in files named after
// name.
func (p PKI) Issue(t testing.TB, name string, roles ...string) Leaf {
	t.Helper()
	der, k := leaf(t, p.CA, p.caKey, both, roles, net.IPv4(127, 0, 0, 1))
	return Leaf{
		Cert: write(t, p.dir, name+".pem", "CERTIFICATE", der),
		Key:  write(t, p.dir, name+"-key.pem", "EC PRIVATE KEY", keyDER(t, k)),
		Pair: pair(der, k),
	}
}

var both = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sign(t testing.TB, tpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) []byte {
	tpl.NotBefore, tpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, tpl, parent, pub, signer)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func newCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
	k := newKey(t)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der := sign(t, tpl, tpl, &k.PublicKey, k)
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, k, der
}

func leaf(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage []x509.ExtKeyUsage, roles []string, ips ...net.IP) ([]byte, *ecdsa.PrivateKey) {
	k := newKey(t)
	var uris []*url.URL
	for _, r := range roles {
		u, err := url.Parse(r)
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, u)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	return sign(t, &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "leaf"}, IPAddresses: ips, URIs: uris,
		ExtKeyUsage: usage, KeyUsage: x509.KeyUsageDigitalSignature}, ca, &k.PublicKey, caKey), k
}

func write(t testing.TB, dir, name, typ string, der []byte) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func keyDER(t testing.TB, k *ecdsa.PrivateKey) []byte {
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pair(der []byte, k *ecdsa.PrivateKey) tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
}

// ClientConfig is TLS to a server of the PKI at 127.0.0.1, presenting certs.
func (p PKI) ClientConfig(certs ...tls.Certificate) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(p.CA)
	return &tls.Config{RootCAs: roots, Certificates: certs, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}
