package xds

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ServerTLS is the xDS server's side of what wb envoy-bootstrap's --tls-ca, --tls-cert and
// --tls-key give an Envoy: the server's certificate and key (PEM files), and the CA that signed
// the Envoys' client certificates. Every client must present one: the resources name every
// node and gateway of the fleet, which no one else should read.
func ServerTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" || clientCAFile == "" {
		return nil, errors.New("--xds-tls-cert, --xds-tls-key and --xds-tls-client-ca go together: give all three or none")
	}
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
	}, nil
}
