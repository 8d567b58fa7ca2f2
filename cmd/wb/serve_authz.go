//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"wb/gateway"
	"wb/internal/mtls"
)

// listenAuthz opens --authz-addr; nil when it is empty (no ext_authz).
func listenAuthz(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--authz-addr: %w", err)
	}
	return ln, nil
}

// authzServer is the gRPC server of gw's ext_authz service (envoy.service.auth.v3), which the
// Envoy fleet calls as its wb_ext_authz cluster. It reads the shared edge secret now, so that
// a gateway that cannot sign grants fails at start. With fleet's files it serves only mutual
// TLS, to the Envoys whose certificate the fleet's CA signed for the Envoy role (wb serve
// --envoy-tls-*): the answers carry the grants the nodes accept.
func authzServer(ctx context.Context, gw *gateway.Server, fleet fleetTLSFlags, log *slog.Logger) (*grpc.Server, error) {
	a, err := gw.Authz(ctx)
	if err != nil {
		return nil, fmt.Errorf("--authz-addr: %w", err)
	}
	var opts []grpc.ServerOption
	if fleet.enabled() {
		cfg, err := mtls.Server(fleet.files(), []string{"h2"}, []string{mtls.RoleEnvoy}, log.With("listener", "--authz-addr"))
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	srv := grpc.NewServer(opts...)
	a.Register(srv)
	return srv, nil
}

// serveAuthz serves srv on ln in g until ctx ends, then stops it, letting Checks in flight
// finish for up to grace.
func serveAuthz(ctx context.Context, g *errgroup.Group, srv *grpc.Server, ln net.Listener, grace time.Duration, tls bool, log *slog.Logger) {
	if !tls && !isLoopback(ln.Addr()) {
		log.Warn("ext_authz served in plaintext: whoever reaches --authz-addr reads the grants it signs for the nodes; give --fleet-tls-cert, --fleet-tls-key and --fleet-tls-ca", "addr", ln.Addr().String())
	}
	log.Info("ext_authz served", "addr", ln.Addr().String(), "tls", tls)
	g.Go(func() error {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("--authz-addr: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(grace):
			srv.Stop()
		}
		return nil
	})
}
