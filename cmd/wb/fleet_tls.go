package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"wb/internal/mtls"
	"wb/node/nodeapi"
)

// fleetTLSFlags are a member's certificate for mutual TLS inside the fleet (--fleet-tls-*):
// a `wb node` serves its listener with it, and a gateway its ext_authz and its calls to the
// nodes. One CA signs the certificates of every member and Envoy.
type fleetTLSFlags struct {
	cert, key, ca string
	// metrics, when not nil, reports the files' expiry and failed reloads.
	metrics *mtls.Metrics
}

// register adds the flags; serves says what the certificate serves, in this command.
func (f *fleetTLSFlags) register(fs *flag.FlagSet, serves string) {
	fs.StringVar(&f.cert, "fleet-tls-cert", "", "PEM `file` of this member's certificate inside the fleet (with --fleet-tls-key and --fleet-tls-ca: mutual TLS). "+serves)
	fs.StringVar(&f.key, "fleet-tls-key", "", "PEM `file` of the --fleet-tls-cert certificate's private key")
	fs.StringVar(&f.ca, "fleet-tls-ca", "", "PEM `file` of the fleet's CA: a client must present a certificate it signed for a role that calls this listener (a URI SAN: spiffe://wb/envoy, the Envoys', wb serve --envoy-tls-*; spiffe://wb/gateway, the gateways', to the nodes), and a node's certificate must be one it signed for spiffe://wb/node. The three files are read again when they change")
}

func (f fleetTLSFlags) enabled() bool { return f.files().Any() }

func (f fleetTLSFlags) files() mtls.Files {
	return mtls.Files{Cert: f.cert, Key: f.key, CA: f.ca, CertFlag: "--fleet-tls-cert", KeyFlag: "--fleet-tls-key", CAFlag: "--fleet-tls-ca", Metrics: f.metrics}
}

// nodeListener wraps ln, a node's listener (the node API and the edge's data path), in mutual
// TLS when the flags are given, and answers the scheme it serves. Without them, a listener
// others can reach is served in plaintext, with a warning: whoever reaches it on the fleet's
// network reads exec traffic and the edge grants in it, and can replay a grant until it
// expires.
func nodeListener(ln net.Listener, f fleetTLSFlags, log *slog.Logger) (net.Listener, string, error) {
	if !f.enabled() {
		if !isLoopback(ln.Addr()) {
			log.Warn("the node API and the edge's data path are served in plaintext: whoever reaches --addr reads exec traffic, the node token and the edge grants; give --fleet-tls-cert, --fleet-tls-key and --fleet-tls-ca", "addr", ln.Addr().String())
		}
		return ln, "http", nil
	}
	// HTTP/1.1 only: the PTY is a WebSocket upgrade, and Envoy's node clusters speak HTTP/1.1.
	// The Envoys call the edge's data path, the gateways the node API; another node never
	// calls a node. The handshake lets in either role; gatewaysOnly keeps an Envoy's
	// certificate off the node API.
	cfg, err := mtls.Server(f.files(), []string{"http/1.1"}, []string{mtls.RoleEnvoy, mtls.RoleGateway}, log.With("listener", "--addr"))
	if err != nil {
		return nil, "", err
	}
	return tls.NewListener(ln, cfg), "https", nil
}

// gatewaysOnly guards api, the node API on a node's listener, by the caller's role: over
// mutual TLS only a client whose certificate names the gateway role calls it. An Envoy's
// certificate, which every Envoy host holds, reaches the edge's data path (exec, PTY and
// files, which the DataPath serves before api, with their own edge grants) and /healthz (the
// Envoys' health checks of the node), and is answered 403 everywhere else, before the node
// token is read: a leaked Envoy key, with or without the token, opens no guest control and
// no agent proxy. A refusal is logged (a misrouted Envoy, or a stolen key). A request without
// TLS (no --fleet-tls-*) passes as before.
func gatewaysOnly(api http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || r.URL.Path == nodeapi.PathHealth || mtls.HasRole(r.TLS.PeerCertificates, mtls.RoleGateway) {
			api.ServeHTTP(w, r)
			return
		}
		role := "no role"
		if roles := mtls.Roles(r.TLS.PeerCertificates); len(roles) > 0 {
			role = "the role " + strings.Join(roles, " and ")
		}
		path := r.URL.Path
		if len(path) > 256 { // the caller's to choose; the message need not carry all of it
			path = path[:256] + "…"
		}
		log.WarnContext(r.Context(), "node API: refused a client certificate that is not of the gateway role", "roles", role, "remote", r.RemoteAddr, "method", r.Method, "path", path)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(nodeapi.ErrorBody{Error: &nodeapi.Error{Status: http.StatusForbidden, Code: nodeapi.CodeForbidden,
			Message: fmt.Sprintf("node: a client certificate of %s calls only the edge's exec, PTY and files and %s here, not %s %s: the node API is the gateways' (%s)",
				role, nodeapi.PathHealth, r.Method, path, mtls.RoleGateway)}})
	})
}

// listenEdge opens --edge-addr, the gateway's API for the Envoys, served over mutual TLS
// only: the public listener cannot require client certificates. nil when addr is empty.
func listenEdge(addr string, f fleetTLSFlags, log *slog.Logger) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	if !f.enabled() {
		return nil, errors.New("--edge-addr serves only mutual TLS: give --fleet-tls-cert, --fleet-tls-key and --fleet-tls-ca")
	}
	cfg, err := mtls.Server(f.files(), []string{"http/1.1"}, []string{mtls.RoleEnvoy}, log.With("listener", "--edge-addr"))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--edge-addr: %w", err)
	}
	return tls.NewListener(ln, cfg), nil
}

// nodeDialer is the gateway's side of the nodes' listeners: it presents the certificate and
// verifies the node's, which must name the node's IP and the node role (a gateway's or an
// Envoy's certificate for that IP does not pass for a node).
func nodeDialer(f fleetTLSFlags, log *slog.Logger) (*mtls.Dialer, error) {
	return mtls.NewDialer(f.files(), mtls.RoleNode, log)
}
