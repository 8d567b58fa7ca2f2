package xds

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// ServerTLS is the xDS server's side of what wb envoy-bootstrap's --tls-ca, --tls-cert and
// --tls-key give an Envoy: the server's certificate and key (PEM files), and the CA that signed
// the Envoys' client certificates. Every client must present one: the resources name every
// node and gateway of the fleet, which no one else should read.
//
// The files are read again when they change (a handshake looks at their times and sizes;
// Envoys connect rarely, and hold their stream), so that a certificate rotated in place, as
// cert-manager or a Vault agent does, needs no restart. A change that does not load (a key
// written before its certificate, a broken file) keeps the last good ones, with a warning.
func ServerTLS(certFile, keyFile, clientCAFile string, log *slog.Logger) (*tls.Config, error) {
	if certFile == "" || keyFile == "" || clientCAFile == "" {
		return nil, errors.New("--xds-tls-cert, --xds-tls-key and --xds-tls-client-ca go together: give all three or none")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &reloadingTLS{files: [3]string{certFile, keyFile, clientCAFile}, log: log}
	stamp := r.stamp()
	cfg, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cfg, r.loaded = cfg, stamp
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: r.forClient}, nil
}

// reloadingTLS holds the TLS configuration its files make, and makes it again when they
// change.
type reloadingTLS struct {
	files [3]string // certificate, key, client CA
	log   *slog.Logger

	mu     sync.Mutex
	cfg    *tls.Config
	loaded string // stamp of the files cfg was read from
}

// forClient answers the configuration for one handshake: the last good one, read again first
// if a file changed since.
func (r *reloadingTLS) forClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	stamp := r.stamp()
	r.mu.Lock()
	defer r.mu.Unlock()
	if stamp != r.loaded {
		cfg, err := r.load()
		if err != nil {
			r.log.Warn("xds: the TLS files changed but do not load; serving the ones loaded before", "err", err)
		} else {
			r.cfg = cfg
			r.log.Info("xds: TLS certificate and client CA loaded again", "cert", r.files[0])
		}
		// Either way not read again until they change again: a half-written pair is
		// completed by the next write, which changes the stamp.
		r.loaded = stamp
	}
	return r.cfg, nil
}

// stamp names the files' state: each one's size and modification time ("-" for one that
// cannot be read).
func (r *reloadingTLS) stamp() string {
	var s string
	for _, f := range r.files {
		fi, err := os.Stat(f)
		if err != nil {
			s += "-;"
			continue
		}
		s += fmt.Sprintf("%d@%s;", fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
	}
	return s
}

func (r *reloadingTLS) load() (*tls.Config, error) {
	certFile, keyFile, clientCAFile := r.files[0], r.files[1], r.files[2]
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--xds-tls-cert and --xds-tls-key: %w", err)
	}
	pem, err := os.ReadFile(clientCAFile)
	if err != nil {
		return nil, fmt.Errorf("--xds-tls-client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--xds-tls-client-ca %s: no PEM certificate in it", clientCAFile)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		NextProtos:   []string{"h2"}, // gRPC's: the handshake uses this configuration's
	}, nil
}
