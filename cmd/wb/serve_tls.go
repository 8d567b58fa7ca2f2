package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"wb/store"
)

// tlsFlags turn the public listener into HTTPS with certificates from an ACME CA, kept in
// Redis (store.CertStorage) so that every gateway on the same Redis serves them and one issues.
type tlsFlags struct {
	domains  []string // names, or *.patterns with onDemand
	onDemand bool
	caURL    string
	email    string
	caRoot   string // PEM file of roots that verify the CA's own HTTPS
}

func (f *tlsFlags) register(fs *flag.FlagSet) {
	fs.Func("tls-domain", "serve HTTPS on --addr for `NAME` (repeatable), with a certificate from the ACME CA (--acme-ca) obtained at start, shared with the other gateways through Redis so one of them issues it; the CA validates with TLS-ALPN-01, so it must reach --addr on port 443 (or a port forwarded to it). With --tls-on-demand, NAME may be *.DOMAIN (any one label under DOMAIN)", func(s string) error {
		name := strings.ToLower(strings.TrimSpace(s))
		if !certmagic.SubjectQualifiesForCert(strings.TrimPrefix(name, "*.")) || strings.ContainsAny(name, ":/") || net.ParseIP(name) != nil {
			return fmt.Errorf("%q is not a DNS name (no scheme, port or IP address: e.g. api.example.com)", s)
		}
		f.domains = append(f.domains, name)
		return nil
	})
	fs.BoolVar(&f.onDemand, "tls-on-demand", false, "obtain each certificate during the first TLS handshake that asks for its name, and only for a name --tls-domain allows (an exact NAME or a *.DOMAIN); a handshake for any other name is refused without asking the CA")
	fs.StringVar(&f.caURL, "acme-ca", certmagic.LetsEncryptProductionCA, "ACME directory `URL` of the CA that issues the --tls-domain certificates (Let's Encrypt's staging: "+certmagic.LetsEncryptStagingCA+")")
	fs.StringVar(&f.email, "acme-email", "", "contact `address` for the ACME account (expiry and policy notices from the CA)")
	fs.StringVar(&f.caRoot, "acme-ca-root", "", "PEM `file` of the roots that verify the ACME CA's own HTTPS, for a private CA such as Pebble (default: the system's roots)")
}

// enabled: the public listener serves HTTPS.
func (f *tlsFlags) enabled() bool { return len(f.domains) > 0 || f.onDemand }

// scheme is the public listener's URL scheme.
func (f *tlsFlags) scheme() string {
	if f.enabled() {
		return "https"
	}
	return "http"
}

// check refuses flags that contradict each other, before anything starts.
func (f *tlsFlags) check() error {
	switch {
	case f.onDemand && len(f.domains) == 0:
		return errors.New("--tls-on-demand needs --tls-domain: it obtains certificates only for the names (or *.DOMAIN patterns) that --tls-domain allows")
	case !f.enabled() && (f.caURL != certmagic.LetsEncryptProductionCA || f.email != "" || f.caRoot != ""):
		return errors.New("--acme-ca, --acme-email and --acme-ca-root apply to --tls-domain, which is not given")
	}
	if !f.onDemand {
		for _, d := range f.domains {
			if strings.HasPrefix(d, "*.") {
				return fmt.Errorf("--tls-domain %s: a *.DOMAIN pattern needs --tls-on-demand (TLS-ALPN-01 cannot validate a wildcard certificate)", d)
			}
		}
	}
	return nil
}

// certStorage is store.CertStorage with certmagic's KeyInfo (store does not import certmagic,
// so that the many packages importing store do not build it).
type certStorage struct{ *store.CertStorage }

func (c certStorage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	info, err := c.CertStorage.Stat(ctx, key)
	return certmagic.KeyInfo(info), err
}

var _ certmagic.Storage = certStorage{}

// listen wraps ln, the public listener, in TLS with certmagic's certificates for the flags'
// names, answering the CA's TLS-ALPN-01 challenges on ln itself. Certificates for --tls-domain
// are obtained (or loaded from Redis) in the background, and renewed, until stop.
func (f *tlsFlags) listen(ctx context.Context, ln net.Listener, st *store.Store, log *slog.Logger) (tlsLn net.Listener, stop func(), err error) {
	issuer := certmagic.ACMEIssuer{CA: f.caURL, Email: f.email, Agreed: true, DisableHTTPChallenge: true}
	if f.caRoot != "" {
		pem, err := os.ReadFile(f.caRoot)
		if err != nil {
			return nil, nil, fmt.Errorf("--acme-ca-root: %w", err)
		}
		issuer.TrustedRoots = x509.NewCertPool()
		if !issuer.TrustedRoots.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("--acme-ca-root %s: no PEM certificate in it", f.caRoot)
		}
	}
	// The challenge is answered by ln's own handshakes: certmagic must not listen itself
	// (it tries ListenHost:port, finds it taken by ln and relies on it).
	if addr, ok := ln.Addr().(*net.TCPAddr); ok {
		issuer.ListenHost, issuer.AltTLSALPNPort = addr.IP.String(), addr.Port
	}
	zl := zap.New(slogCore{log: log.With("component", "certmagic")})
	issuer.Logger = zl
	var cfg *certmagic.Config
	cache := certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return cfg, nil },
		Logger:           zl,
	})
	template := certmagic.Config{Storage: certStorage{st.CertStorage(0)}, Logger: zl}
	if f.onDemand {
		template.OnDemand = &certmagic.OnDemandConfig{DecisionFunc: f.allow}
	}
	cfg = certmagic.New(cache, template)
	cfg.Issuers = []certmagic.Issuer{certmagic.NewACMEIssuer(cfg, issuer)}
	ctx, cancel := context.WithCancel(ctx) // ends ManageAsync's retries with stop
	stop = func() { cancel(); cache.Stop() }
	if err := cfg.ManageAsync(ctx, f.domains); err != nil {
		stop()
		return nil, nil, fmt.Errorf("--tls-domain: %w", err)
	}
	tc := cfg.TLSConfig()
	tc.NextProtos = append([]string{"h2", "http/1.1"}, tc.NextProtos...)
	tc.MinVersion = tls.VersionTLS12
	log.Info("TLS on the public listener", "domains", f.domains, "on_demand", f.onDemand, "acme_ca", f.caURL)
	return tls.NewListener(ln, tc), stop, nil
}

// allow is on-demand TLS's decision: a certificate only for a name --tls-domain gives, or one
// label under a *.DOMAIN it gives.
func (f *tlsFlags) allow(_ context.Context, name string) error {
	name = strings.ToLower(name)
	for _, d := range f.domains {
		if name == d || (strings.HasPrefix(d, "*.") && certmagic.MatchWildcard(name, d)) {
			return nil
		}
	}
	return fmt.Errorf("%q is not a --tls-domain of this gateway", name)
}

// slogCore is a zap core that writes to slog, so certmagic's logs join the process's own.
type slogCore struct{ log *slog.Logger }

func (c slogCore) Enabled(l zapcore.Level) bool {
	return c.log.Enabled(context.Background(), slogLevel(l))
}

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	return slogCore{log: c.log.With(zapAttrs(fields)...)}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	attrs := zapAttrs(fields)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	c.log.Log(context.Background(), slogLevel(e.Level), e.Message, attrs...)
	return nil
}

func (slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l < zapcore.InfoLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}

func zapAttrs(fields []zapcore.Field) []any {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]any, 0, len(enc.Fields))
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	return attrs
}
