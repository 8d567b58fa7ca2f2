package edgeauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"wb/session"
)

// Headers of the edge data path.
const (
	// HeaderCluster names the Envoy cluster (the node) that ext_authz chose; the routes of
	// exec, PTY and files forward on it (`cluster_header`).
	HeaderCluster = "x-wb-cluster"
	// HeaderEdgeAuth carries the grant that ext_authz signed for the node.
	HeaderEdgeAuth = "x-wb-edge-auth"
)

// NodeCluster is the Envoy cluster of one node, the value of HeaderCluster: "wb_node_" and
// the node id with every character outside [A-Za-z0-9_.-] replaced by "_". xds names the
// clusters with it and ext_authz routes with it.
func NodeCluster(nodeID string) string {
	return "wb_node_" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-' {
			return r
		}
		return '_'
	}, nodeID)
}

// Purposes keep the grants of one use from passing for another.
const (
	PurposeEdge    = "edge"    // ext_authz → node, in HeaderEdgeAuth
	PurposeConnect = "connect" // gateway → caller, in a session's connect URLs
)

// version prefixes every grant, so that the format can change without ambiguity.
const version = "v1"

// maxGrantLen bounds what Verify reads: a grant is a few hundred bytes.
const maxGrantLen = 2048

// Grant is what a signed value says: who may reach which session, on which node, until when.
type Grant struct {
	SessionID string `json:"sid"`
	ProjectID string `json:"pid"`
	NodeID    string `json:"nid,omitempty"`
	// ByToken, in an edge grant, says that the caller authenticated with a connect token
	// rather than an API key, so that the node treats the request as the gateway's own
	// handlers treat one (the token left out of the request, any Origin allowed on a PTY).
	ByToken bool `json:"tok,omitempty"`
	// Expires is in Unix seconds.
	Expires int64 `json:"exp"`
}

// ExpiresAt is the grant's expiry as a time.
func (g Grant) ExpiresAt() time.Time { return time.Unix(g.Expires, 0) }

// ErrInvalid is the class of every Verify failure: a caller maps it to 401/403.
var ErrInvalid = errors.New("edgeauth: invalid grant")

// Signer signs and verifies the grants of one purpose.
type Signer struct {
	key []byte
	// macs keeps keyed HMACs for reuse: hmac.New hashes the key's two pads, and a Reset
	// restores them from a saved state (a grant signed and verified: 3.9 → 3.0 µs).
	macs sync.Pool
}

// NewSigner keys a Signer from the shared secret and the purpose. The secret must hold at
// least 32 bytes.
func NewSigner(secret []byte, purpose string) (*Signer, error) {
	if len(secret) < 32 {
		return nil, fmt.Errorf("edgeauth: the secret has %d bytes; it needs at least 32", len(secret))
	}
	if purpose == "" {
		return nil, errors.New("edgeauth: a purpose is required")
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("wb edge grant " + version + " " + purpose))
	key := m.Sum(nil)
	return &Signer{key: key, macs: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}, nil
}

// Sign returns the grant as "v1.<payload>.<mac>", URL-safe base64 without padding, so that it
// fits a header and a query parameter unescaped.
func (s *Signer) Sign(g Grant) string {
	// In one buffer, the payload json.Marshal's encoding of g (appendJSON): every create's
	// answer signs one, and making each piece a string to join them was half of Sign's CPU.
	var js [256]byte
	payload := g.appendJSON(js[:0])
	enc := base64.RawURLEncoding
	b := make([]byte, 0, len(version)+1+enc.EncodedLen(len(payload))+1+enc.EncodedLen(sha256.Size))
	b = enc.AppendEncode(append(b, version+"."...), payload)
	m := s.macs.Get().(hash.Hash)
	m.Reset()
	_, _ = m.Write(b[len(version)+1:]) // a hash takes every write
	mac := m.Sum(nil)
	s.macs.Put(m)
	return string(enc.AppendEncode(append(b, '.'), mac))
}

// appendJSON appends g as json.Marshal encodes it.
func (g Grant) appendJSON(b []byte) []byte {
	b = append(b, `{"sid":`...)
	b = session.AppendJSONString(b, g.SessionID)
	b = append(b, `,"pid":`...)
	b = session.AppendJSONString(b, g.ProjectID)
	if g.NodeID != "" {
		b = append(b, `,"nid":`...)
		b = session.AppendJSONString(b, g.NodeID)
	}
	if g.ByToken {
		b = append(b, `,"tok":true`...)
	}
	b = append(b, `,"exp":`...)
	b = strconv.AppendInt(b, g.Expires, 10)
	return append(b, '}')
}

// Verify checks the signature and the expiry against now, and returns the grant. Every
// failure wraps ErrInvalid and says which check failed.
func (s *Signer) Verify(value string, now time.Time) (Grant, error) {
	if len(value) > maxGrantLen {
		return Grant{}, fmt.Errorf("%w: longer than %d bytes", ErrInvalid, maxGrantLen)
	}
	ver, rest, ok := strings.Cut(value, ".")
	if !ok || ver != version {
		return Grant{}, fmt.Errorf("%w: not a %s grant", ErrInvalid, version)
	}
	p, sig, ok := strings.Cut(rest, ".")
	if !ok {
		return Grant{}, fmt.Errorf("%w: no signature", ErrInvalid)
	}
	// Strict: the signature's last character has two unused bits, and a lenient decoder
	// accepts four spellings of one signature (a token changed there still verified).
	got, err := base64.RawURLEncoding.Strict().DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(p)) {
		return Grant{}, fmt.Errorf("%w: bad signature", ErrInvalid)
	}
	payload, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return Grant{}, fmt.Errorf("%w: bad payload", ErrInvalid)
	}
	var g Grant
	if err := json.Unmarshal(payload, &g); err != nil {
		return Grant{}, fmt.Errorf("%w: bad payload", ErrInvalid)
	}
	if g.SessionID == "" || g.ProjectID == "" {
		return Grant{}, fmt.Errorf("%w: no session or project", ErrInvalid)
	}
	if !now.Before(g.ExpiresAt()) {
		return Grant{}, fmt.Errorf("%w: expired at %s", ErrInvalid, g.ExpiresAt().UTC().Format(time.RFC3339))
	}
	return g, nil
}

func (s *Signer) mac(payload string) []byte {
	m := s.macs.Get().(hash.Hash)
	m.Reset()
	_, _ = io.WriteString(m, payload) // a hash takes every write
	sum := m.Sum(nil)
	s.macs.Put(m)
	return sum
}
