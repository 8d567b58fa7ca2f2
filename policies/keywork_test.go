package policies

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestKeyMaterialBundle: a bundle of two dozen 2048-bit RSA certificates (33 KiB of PEM) is
// taken, each certificate's base64 being its own run, while one run as long is refused.
func TestKeyMaterialBundle(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "root CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	bundle := strings.Repeat(string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), 30)
	check := keyMaterial(0)
	if _, err := check([]*ast.Term{ast.StringTerm(bundle)}, 0, nil); err != nil {
		t.Errorf("a bundle of 30 certificates, %d bytes: %v", len(bundle), err)
	}
	if _, err := check([]*ast.Term{ast.StringTerm(strings.Repeat("A", len(bundle)))}, 0, nil); err == nil {
		t.Errorf("one run of %d bytes is taken", len(bundle))
	}
}

// TestKeyMaterialManyKeys: a key set of thousands of small keys is refused (each is parsed and
// tried in turn), one of a few dozen taken.
func TestKeyMaterialManyKeys(t *testing.T) {
	k := `{"kty":"EC","crv":"P-256","x":"w0-53WecTv_Ue0NFxoC4ZIZXF2PFEMXwcckW6c5wHeI","y":"Es8xcQyAIM8cKHTajYSV3KsZ3xYg0IZ6blwCF17YVZA"}`
	set := func(n int) *ast.Term {
		return ast.StringTerm(`{"keys":[` + strings.TrimSuffix(strings.Repeat(k+",", n), ",") + `]}`)
	}
	check := keyMaterial(1)
	if _, err := check([]*ast.Term{ast.StringTerm("token"), set(32768)}, 0, nil); err == nil {
		t.Error("a set of 32,768 P-256 keys is taken, want it refused")
	}
	if _, err := check([]*ast.Term{ast.StringTerm("token"), set(48)}, 0, nil); err != nil {
		t.Errorf("a set of 48 P-256 keys: %v", err)
	}
}
