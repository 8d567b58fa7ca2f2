// Package mtls serves and dials mutual TLS between the members of a wb fleet (xDS, ext_authz,
// the nodes' listeners) from PEM files that are read again when they change, so that
// certificates rotated in place, as cert-manager or a Vault agent does, need no restart.
//
// One CA signs the certificates of every member, so its signature alone says only "a member
// of the fleet": each certificate also names its member's roles, as URI SANs (SPIFFE IDs of
// the trust domain "wb": RoleNode, RoleGateway, RoleEnvoy), and each side checks the other's.
// Without the roles, a compromised node host, which has a fleet certificate, could serve as
// a gateway or call another node as one.
package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// Files are one member's certificate and key, and the CA it trusts (PEM files), with the
// names of the flags that gave them, which errors, logs and metrics use.
type Files struct {
	Cert, Key, CA             string
	CertFlag, KeyFlag, CAFlag string
	// Metrics, when not nil, reports the files' expiry and failed reloads.
	Metrics *Metrics
}

// Any says whether any file is given.
func (f Files) Any() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Check refuses an incomplete set: a flag checks it before anything starts.
func (f Files) Check() error {
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return fmt.Errorf("%s, %s and %s go together: give all three or none", f.CertFlag, f.KeyFlag, f.CAFlag)
	}
	return nil
}

// The roles of the fleet's members, each a URI SAN of its certificates. A certificate may
// name several (one member serving as two).
const (
	// RoleNode serves a `wb node`'s listener.
	RoleNode = "spiffe://wb/node"
	// RoleGateway serves a gateway's ext_authz and --edge-addr, and calls the nodes.
	RoleGateway = "spiffe://wb/gateway"
	// RoleEnvoy calls xDS, ext_authz, the gateways' --edge-addr and the nodes.
	RoleEnvoy = "spiffe://wb/envoy"
)

// Server answers a server configuration that requires every client to present a
// certificate the CA signed that names one of the roles clients, and serves the certificate;
// nextProtos are the ALPN protocols it offers ("h2" for gRPC, "http/1.1" for an HTTP/1
// listener). A client of another role is refused, and logged with the roles expected and
// the SANs it has. The files are read again at a handshake when they changed since (their
// times and sizes): a change that does not load (a key written before its certificate, a
// broken file) keeps the last good ones, with a warning.
func Server(f Files, nextProtos []string, clients []string, log *slog.Logger) (*tls.Config, error) {
	if len(clients) == 0 {
		return nil, errors.New("mtls: a server takes clients of at least one role")
	}
	r, err := newReloading(f, log, func(cert tls.Certificate, pool *x509.CertPool) *tls.Config {
		return &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{cert},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			NextProtos:   nextProtos, // the handshake uses this configuration's
		}
	})
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		cfg := r.current().Clone()
		// After the chain is verified: the CA signed it, so only the role is left to check.
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			err := checkRole(cs.PeerCertificates, "client", clients)
			if err != nil {
				remote := ""
				if hello.Conn != nil {
					remote = hello.Conn.RemoteAddr().String()
				}
				r.log.Warn("mutual TLS: refused a client of the fleet's CA", "cert_flag", f.CertFlag, "remote", remote, "err", err)
			}
			return err
		}
		return cfg, nil
	}}, nil
}

// RoleError is a certificate of the CA that names none of the roles expected.
type RoleError struct {
	Peer string   // "client", or "server HOST:PORT"
	Want []string // the roles any one of which would do
	Cert *x509.Certificate
}

func (e *RoleError) Error() string {
	sans := func(kind string, names []string) string {
		if len(names) == 0 {
			return "no " + kind + " SAN"
		}
		return kind + " SANs [" + strings.Join(names, " ") + "]"
	}
	var uris, ips []string
	for _, u := range e.Cert.URIs {
		uris = append(uris, u.String())
	}
	for _, ip := range e.Cert.IPAddresses {
		ips = append(ips, ip.String())
	}
	return fmt.Sprintf("the %s's certificate (CN %q) is not of the role %s: it has %s, %s and %s",
		e.Peer, e.Cert.Subject.CommonName, strings.Join(e.Want, " or "), sans("URI", uris), sans("DNS", e.Cert.DNSNames), sans("IP", ips))
}

// checkRole answers a *RoleError unless the leaf of chain names one of the roles want.
func checkRole(chain []*x509.Certificate, peer string, want []string) error {
	if len(chain) == 0 {
		return fmt.Errorf("the %s presented no certificate", peer)
	}
	for _, w := range want {
		if HasRole(chain, w) {
			return nil
		}
	}
	return &RoleError{Peer: peer, Want: want, Cert: chain[0]}
}

// HasRole reports whether the leaf of chain names role (a URI SAN). A server reads a client's
// role with it, from the chain the handshake verified (http.Request.TLS.PeerCertificates), to
// answer each request by the role of its caller: Server lets in any of several roles. An
// empty chain names none.
func HasRole(chain []*x509.Certificate, role string) bool {
	if len(chain) == 0 {
		return false
	}
	for _, u := range chain[0].URIs {
		if u.String() == role {
			return true
		}
	}
	return false
}

// Roles answers the fleet's roles (RoleNode, RoleGateway, RoleEnvoy, in that order) that the
// leaf of chain names: for messages that say who called.
func Roles(chain []*x509.Certificate) []string {
	var roles []string
	for _, r := range []string{RoleNode, RoleGateway, RoleEnvoy} {
		if HasRole(chain, r) {
			roles = append(roles, r)
		}
	}
	return roles
}

// Dialer dials servers of the fleet over TLS: it presents the certificate and verifies the
// server's against the CA, the host dialled (an IP address needs an IP SAN) and the server's
// role.
type Dialer struct {
	r         *reloading
	role      string
	dialer    net.Dialer
	handshake time.Duration // handshakeTimeout; tests shorten it
}

// NewDialer reads the files, as Server does; the files are read again at a dial when they
// changed since. The servers it dials must have certificates of the role server.
func NewDialer(f Files, server string, log *slog.Logger) (*Dialer, error) {
	if server == "" {
		return nil, errors.New("mtls: a dialer needs the role of the servers it dials")
	}
	r, err := newReloading(f, log, func(cert tls.Certificate, pool *x509.CertPool) *tls.Config {
		return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, RootCAs: pool}
	})
	if err != nil {
		return nil, err
	}
	return &Dialer{r: r, role: server, dialer: net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}, handshake: handshakeTimeout}, nil
}

// handshakeTimeout bounds a dial's handshake: http.Transport hands DialTLSContext a context
// detached from the request's end, and applies no TLSHandshakeTimeout of its own to it, so a
// wedged server that accepts but never answers held the dial, its goroutine and its
// descriptor for good.
const handshakeTimeout = 10 * time.Second

// DialTLSContext connects to addr (host:port) and completes the handshake, within
// handshakeTimeout; it fits http.Transport.DialTLSContext.
func (d *Dialer) DialTLSContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	raw, err := d.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	cfg := d.r.current().Clone()
	cfg.ServerName = host
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		return checkRole(cs.PeerCertificates, "server "+addr, []string{d.role})
	}
	conn := tls.Client(raw, cfg)
	hctx, cancel := context.WithTimeout(ctx, d.handshake)
	defer cancel()
	if err := conn.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, err
	}
	return conn, nil
}

// reloading holds the configuration its files make, and makes it again when they change.
type reloading struct {
	files Files
	log   *slog.Logger
	build func(tls.Certificate, *x509.CertPool) *tls.Config

	mu       sync.Mutex
	cfg      *tls.Config
	notAfter time.Time // the earliest NotAfter of cfg's certificates and CA
	loaded   string    // stamp of the files cfg was read from
}

func newReloading(f Files, log *slog.Logger, build func(tls.Certificate, *x509.CertPool) *tls.Config) (*reloading, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &reloading{files: f, log: log, build: build}
	stamp := r.stamp()
	cfg, notAfter, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cfg, r.notAfter, r.loaded = cfg, notAfter, stamp
	if f.Metrics != nil {
		f.Metrics.add(r)
	}
	return r, nil
}

// current answers the last good configuration, read again first if a file changed since.
func (r *reloading) current() *tls.Config {
	stamp := r.stamp()
	r.mu.Lock()
	defer r.mu.Unlock()
	if stamp != r.loaded {
		cfg, notAfter, err := r.load()
		if err != nil {
			r.log.Warn("the TLS files of "+r.files.CertFlag+" changed but do not load; using the ones loaded before", "err", err)
			if r.files.Metrics != nil {
				r.files.Metrics.failures.WithLabelValues(r.files.CertFlag).Inc()
			}
		} else {
			r.cfg, r.notAfter = cfg, notAfter
			r.log.Info("the TLS files of "+r.files.CertFlag+" loaded again", "cert", r.files.Cert)
		}
		// Either way not read again until they change again: a half-written pair is
		// completed by the next write, which changes the stamp.
		r.loaded = stamp
	}
	return r.cfg
}

// stamp names the files' state: each one's size and modification time ("-" for one that
// cannot be read).
func (r *reloading) stamp() string {
	var s string
	for _, f := range []string{r.files.Cert, r.files.Key, r.files.CA} {
		fi, err := os.Stat(f)
		if err != nil {
			s += "-;"
			continue
		}
		s += fmt.Sprintf("%d@%s;", fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
	}
	return s
}

// load reads the files, and answers the configuration and the earliest NotAfter of their
// certificates.
func (r *reloading) load() (*tls.Config, time.Time, error) {
	f := r.files
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%s and %s: %w", f.CertFlag, f.KeyFlag, err)
	}
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%s: %w", f.CAFlag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, time.Time{}, fmt.Errorf("%s %s: %w", f.CAFlag, f.CA, errNoPEM)
	}
	return r.build(cert, pool), earliestNotAfter(cert.Certificate, pem), nil
}

var errNoPEM = errors.New("no PEM certificate in it")
