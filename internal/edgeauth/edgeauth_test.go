package edgeauth

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

var secret = bytes.Repeat([]byte{7}, 32)

const base64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

func signer(t *testing.T, purpose string) *Signer {
	t.Helper()
	s, err := NewSigner(secret, purpose)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSignVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := signer(t, PurposeEdge)
	g := Grant{SessionID: "sess_a", ProjectID: "proj_a", NodeID: "node_1", Expires: now.Add(time.Minute).Unix()}
	v := s.Sign(g)
	got, err := s.Verify(v, now)
	if err != nil || got != g {
		t.Fatalf("Verify = %+v, %v; want %+v", got, err, g)
	}
	if _, err := s.Verify(v, now.Add(time.Minute)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("at its expiry: %v, want expired", err)
	}
	other := signer(t, PurposeConnect)
	if _, err := other.Verify(v, now); !errors.Is(err, ErrInvalid) {
		t.Errorf("an edge grant passed as a connect token: %v", err)
	}
	wrongKey, _ := NewSigner(bytes.Repeat([]byte{8}, 32), PurposeEdge)
	if _, err := wrongKey.Verify(v, now); !errors.Is(err, ErrInvalid) {
		t.Errorf("another secret's grant passed: %v", err)
	}
	// A payload changed under its signature fails.
	parts := strings.Split(v, ".")
	forged := s.Sign(Grant{SessionID: "sess_b", ProjectID: "proj_a", Expires: g.Expires})
	if _, err := s.Verify(parts[0]+"."+strings.Split(forged, ".")[1]+"."+parts[2], now); !errors.Is(err, ErrInvalid) {
		t.Errorf("a swapped payload passed: %v", err)
	}
	// One signature, one spelling: its last character's unused bits set is refused.
	last := strings.IndexByte(base64URL, parts[2][len(parts[2])-1])
	for _, alt := range []int{last ^ 1, last ^ 2, last ^ 3} {
		respelled := parts[0] + "." + parts[1] + "." + parts[2][:len(parts[2])-1] + string(base64URL[alt])
		if _, err := s.Verify(respelled, now); !errors.Is(err, ErrInvalid) {
			t.Errorf("the signature respelled in its unused bits passed: %v", err)
		}
	}
	for _, bad := range []string{"", "v1", "v1.", "v1.x.y", "v2." + parts[1] + "." + parts[2], strings.Repeat("a", 5000)} {
		if _, err := s.Verify(bad, now); !errors.Is(err, ErrInvalid) {
			t.Errorf("Verify(%.20q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestNewSignerRefusesShortSecret(t *testing.T) {
	if _, err := NewSigner([]byte("short"), PurposeEdge); err == nil {
		t.Fatal("a 5-byte secret was accepted")
	}
	if _, err := NewSigner(secret, ""); err == nil {
		t.Fatal("an empty purpose was accepted")
	}
}

func FuzzVerify(f *testing.F) {
	s, _ := NewSigner(secret, PurposeEdge)
	f.Add(s.Sign(Grant{SessionID: "s", ProjectID: "p", Expires: 2_000_000_000}))
	f.Add("v1.e30.AAAA")
	f.Fuzz(func(t *testing.T, v string) {
		g, err := s.Verify(v, time.Unix(1_800_000_000, 0))
		if err == nil && (g.SessionID == "" || s.Sign(g) == "") {
			t.Fatalf("accepted %q as %+v", v, g)
		}
	})
}
