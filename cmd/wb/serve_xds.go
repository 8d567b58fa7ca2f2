package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"wb/store"
	"wb/xds"
)

// xdsFlags configure the xDS control plane that `wb serve` runs for an Envoy fleet.
type xdsFlags struct {
	addr string
}

func (f *xdsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "xds-addr", "", "`host:port` serving xDS (ADS over gRPC) to an Envoy fleet, built from the nodes and gateways registered in Redis (see wb envoy-bootstrap); empty: off")
}

// listenXDS opens the xDS listener before wb serve reports ready, and answers what runs it;
// with no --xds-addr it runs nothing. The edge forgets a node after nodeTimeout, the
// silence after which the placer fails its sessions.
func listenXDS(ctx context.Context, f xdsFlags, nodeTimeout time.Duration, st *store.Store, reg prometheus.Registerer, log *slog.Logger) (func(context.Context, *errgroup.Group), error) {
	if f.addr == "" {
		return func(context.Context, *errgroup.Group) {}, nil
	}
	srv, err := xds.New(ctx, xds.Config{Source: xds.StoreFleet{Store: st, HeartbeatTimeout: nodeTimeout}, Registerer: reg, Logger: log})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return nil, fmt.Errorf("--xds-addr: %w", err)
	}
	log.Info("xds served", "addr", ln.Addr().String())
	return func(ctx context.Context, g *errgroup.Group) {
		g.Go(func() error { return srv.Run(ctx) })
		g.Go(func() error { return srv.Serve(ctx, ln) })
	}, nil
}
