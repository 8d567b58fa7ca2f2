package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Member is a certificate Mint makes: NAME.pem and NAME-key.pem, naming the roles (URI SANs,
// RoleNode...) and the IPs (a node's certificate must name the IP it advertises).
type Member struct {
	Name  string
	Roles []string
	IPs   []net.IP
}

// Mint makes a throwaway fleet CA, written to dir/ca.pem (last, so a dir with it is whole),
// and a certificate of it for each member (dir/NAME.pem, dir/NAME-key.pem), valid for
// validity; the CA's key is not kept, so
// nothing more can be issued under it. It is for a fleet on one machine (wb fleet --tls) and
// for trying the layout out; a production fleet's CA is the operator's. Each certificate
// serves and dials (both key usages).
func Mint(dir string, validity time.Duration, members []Member) error {
	if validity <= 0 {
		return errors.New("mtls: a certificate's validity must be positive")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	// An hour back: the clocks of the fleet's hosts need not agree to the second.
	notBefore, notAfter := time.Now().Add(-time.Hour), time.Now().Add(validity)
	serial := func() (*big.Int, error) { return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)) }
	sn, err := serial()
	if err != nil {
		return err
	}
	caTpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: "wb fleet CA (throwaway)"},
		NotBefore: notBefore, NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	for _, m := range members {
		if m.Name == "" || m.Name == "ca" || filepath.Base(m.Name) != m.Name {
			return fmt.Errorf("mtls: member name %q: want a plain file name other than ca", m.Name)
		}
		var uris []*url.URL
		for _, r := range m.Roles {
			u, err := url.Parse(r)
			if err != nil || u.Scheme != "spiffe" {
				return fmt.Errorf("mtls: member %s: role %q is not a spiffe:// URI", m.Name, r)
			}
			uris = append(uris, u)
		}
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		sn, err := serial()
		if err != nil {
			return err
		}
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: m.Name},
			NotBefore: notBefore, NotAfter: notAfter, URIs: uris, IPAddresses: m.IPs, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}, ca, &k.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("mtls: member %s: %w", m.Name, err)
		}
		keyDER, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, m.Name+"-key.pem"), "EC PRIVATE KEY", keyDER, 0o600); err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, m.Name+".pem"), "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
	}
	// Last: a dir with ca.pem holds every member's files.
	return writePEM(filepath.Join(dir, "ca.pem"), "CERTIFICATE", caDER, 0o644)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}
