package xds

import (
	"crypto/tls"
	"log/slog"

	"wb/internal/mtls"
)

// ServerTLS is the xDS server's side of what wb envoy-bootstrap's --tls-ca, --tls-cert and
// --tls-key give an Envoy: the server's certificate and key (PEM files), and the CA that signed
// the Envoys' client certificates. Every client must present one, of the Envoy role
// (mtls.RoleEnvoy): the resources name every node and gateway of the fleet, which no one
// else should read, not even another member.
//
// The files are read again when they change (a handshake looks at their times and sizes;
// Envoys connect rarely, and hold their stream), so that a certificate rotated in place, as
// cert-manager or a Vault agent does, needs no restart. A change that does not load (a key
// written before its certificate, a broken file) keeps the last good ones, with a warning,
// and is counted in m (when not nil), which also reports the files' expiry.
func ServerTLS(certFile, keyFile, clientCAFile string, m *mtls.Metrics, log *slog.Logger) (*tls.Config, error) {
	return mtls.Server(mtls.Files{Cert: certFile, Key: keyFile, CA: clientCAFile,
		CertFlag: "--xds-tls-cert", KeyFlag: "--xds-tls-key", CAFlag: "--xds-tls-client-ca", Metrics: m}, []string{"h2"}, []string{mtls.RoleEnvoy}, log)
}
