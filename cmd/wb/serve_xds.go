package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"wb/internal/mtls"
	"wb/store"
	"wb/xds"
)

// xdsFlags configure the xDS control plane that `wb serve` runs for an Envoy fleet.
type xdsFlags struct {
	addr                      string
	certFile, keyFile, caFile string
	// envoy are files on the Envoys' hosts, which the clusters name (--envoy-tls-*).
	envoy xds.UpstreamTLS
}

func (f *xdsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "xds-addr", "", "`host:port` serving xDS (ADS over gRPC) to an Envoy fleet, built from the nodes and gateways registered in Redis (see wb envoy-bootstrap); empty: off")
	fs.StringVar(&f.certFile, "xds-tls-cert", "", "PEM `file` of the xDS server's certificate, of the gateway role (a URI SAN spiffe://wb/gateway), which Envoys bootstrapped with wb envoy-bootstrap --tls-* require (with --xds-tls-key and --xds-tls-client-ca: xDS only over TLS, to those Envoys)")
	fs.StringVar(&f.keyFile, "xds-tls-key", "", "PEM `file` of that certificate's private key")
	fs.StringVar(&f.caFile, "xds-tls-client-ca", "", "PEM `file` of the CA that signed the Envoys' client certificates; a client without one is refused")
	fs.StringVar(&f.envoy.CertFile, "envoy-tls-cert", "", "`path`, on the Envoys' hosts, of the client certificate each Envoy presents to the gateways' ext_authz and --edge-addr and to the nodes, of the Envoy role spiffe://wb/envoy (with --envoy-tls-key and --envoy-tls-ca: every xDS cluster speaks mutual TLS, to gateways and nodes that serve --fleet-tls-*, and the gateways' cluster reaches their --edge-addr, not their public --addr); every Envoy must have these three files at these paths; they are sent as SDS secrets naming them, and Envoy reads them again when a rotation moves new files into their directory")
	fs.StringVar(&f.envoy.KeyFile, "envoy-tls-key", "", "`path`, on the Envoys' hosts, of that certificate's private key")
	fs.StringVar(&f.envoy.CAFile, "envoy-tls-ca", "", "`path`, on the Envoys' hosts, of the fleet's CA (the --fleet-tls-ca of the gateways and nodes), which must have signed the gateways' and nodes' certificates")
}

// options are the resources' options the flags give.
func (f xdsFlags) options() (xds.Options, error) {
	u := f.envoy
	if u != (xds.UpstreamTLS{}) {
		if f.addr == "" {
			return xds.Options{}, errors.New("--envoy-tls-cert, --envoy-tls-key and --envoy-tls-ca apply to --xds-addr, which is not given")
		}
		if u.CertFile == "" || u.KeyFile == "" || u.CAFile == "" {
			return xds.Options{}, errors.New("--envoy-tls-cert, --envoy-tls-key and --envoy-tls-ca go together: give all three or none")
		}
	}
	return xds.Options{UpstreamTLS: u}, nil
}

// listenXDS opens the xDS listener before wb serve reports ready, and answers what runs it;
// with no --xds-addr it runs nothing. The edge forgets a node after nodeTimeout, the
// silence after which the placer fails its sessions.
func listenXDS(ctx context.Context, f xdsFlags, nodeTimeout time.Duration, st *store.Store, reg prometheus.Registerer, tlsMetrics *mtls.Metrics, log *slog.Logger) (func(context.Context, *errgroup.Group), error) {
	opts, err := f.options()
	if err != nil {
		return nil, err
	}
	tlsSet := f.certFile != "" || f.keyFile != "" || f.caFile != ""
	if f.addr == "" {
		if tlsSet {
			return nil, errors.New("--xds-tls-cert, --xds-tls-key and --xds-tls-client-ca apply to --xds-addr, which is not given")
		}
		return func(context.Context, *errgroup.Group) {}, nil
	}
	cfg := xds.Config{Source: xds.StoreFleet{Store: st, HeartbeatTimeout: nodeTimeout}, Registerer: reg, Logger: log, Options: opts}
	if tlsSet {
		if cfg.TLS, err = xds.ServerTLS(f.certFile, f.keyFile, f.caFile, tlsMetrics, log); err != nil {
			return nil, err
		}
	}
	srv, err := xds.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return nil, fmt.Errorf("--xds-addr: %w", err)
	}
	if cfg.TLS == nil && !isLoopback(ln.Addr()) {
		log.Warn("xds served in plaintext to any client: the fleet's topology is readable by whoever reaches --xds-addr; give --xds-tls-cert, --xds-tls-key and --xds-tls-client-ca", "addr", ln.Addr().String())
	}
	log.Info("xds served", "addr", ln.Addr().String(), "tls", cfg.TLS != nil, "upstream_tls", opts.UpstreamTLS != (xds.UpstreamTLS{}))
	return func(ctx context.Context, g *errgroup.Group) {
		g.Go(func() error { return srv.Run(ctx) })
		g.Go(func() error { return srv.Serve(ctx, ln) })
	}, nil
}

// isLoopback says whether addr is a TCP address on a loopback interface.
func isLoopback(addr net.Addr) bool {
	a, ok := addr.(*net.TCPAddr)
	return ok && a.IP.IsLoopback()
}
