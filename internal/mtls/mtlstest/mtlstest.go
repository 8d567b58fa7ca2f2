// Package mtlstest makes the certificates that mutual TLS tests need: a CA, a certificate
// for 127.0.0.1 signed by it, and a client certificate of another CA.
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
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a CA (CA, in CAFile) with a certificate for 127.0.0.1 that serves and dials (Cert
// and Key files, Member), a client certificate (Client, also in ClientCert and ClientKey),
// and a client certificate of another CA (Other, also in OtherCert and OtherKey).
type PKI struct {
	CA                    *x509.Certificate
	CAFile                string
	Cert, Key             string
	ClientCert, ClientKey string
	OtherCert, OtherKey   string
	Member, Client, Other tls.Certificate
}

// New writes a fresh PKI in a temporary directory of t.
func New(t testing.TB) PKI {
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
	leaf := func(ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage []x509.ExtKeyUsage, ips ...net.IP) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		return sign(&x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "leaf"}, IPAddresses: ips,
			ExtKeyUsage: usage, KeyUsage: x509.KeyUsageDigitalSignature}, ca, &k.PublicKey, caKey), k
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
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	memDER, memKey := leaf(ca, caKey, both, net.IPv4(127, 0, 0, 1))
	cliDER, cliKey := leaf(ca, caKey, client)
	otherDER, otherCliKey := leaf(other, otherKey, client)
	return PKI{
		CA:         ca,
		CAFile:     write("ca.pem", "CERTIFICATE", caDER),
		Cert:       write("member.pem", "CERTIFICATE", memDER),
		Key:        write("member-key.pem", "EC PRIVATE KEY", keyDER(memKey)),
		ClientCert: write("client.pem", "CERTIFICATE", cliDER),
		ClientKey:  write("client-key.pem", "EC PRIVATE KEY", keyDER(cliKey)),
		OtherCert:  write("other.pem", "CERTIFICATE", otherDER),
		OtherKey:   write("other-key.pem", "EC PRIVATE KEY", keyDER(otherCliKey)),
		Member:     pair(memDER, memKey),
		Client:     pair(cliDER, cliKey),
		Other:      pair(otherDER, otherCliKey),
	}
}

// ClientConfig is TLS to a server of the PKI at 127.0.0.1, presenting certs.
func (p PKI) ClientConfig(certs ...tls.Certificate) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(p.CA)
	return &tls.Config{RootCAs: roots, Certificates: certs, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}
