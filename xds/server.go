package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"wb/store"
)

// fleetKey is the cache key every Envoy maps to, grpcKey every gRPC xDS client: the whole
// fleet gets the same resources, so one snapshot serves any number of node ids; gRPC's
// differ only in their TLS clusters (BuildGRPC).
const (
	fleetKey = "wb_fleet"
	grpcKey  = "wb_fleet_grpc"
)

type fleetHash struct{}

// ID tells gRPC's xDS clients by the user agent they send in every stream's node ("gRPC Go",
// "gRPC Java", "gRPC C-core"...; Envoy sends "envoy"); any other client gets Envoy's
// resources.
func (fleetHash) ID(n *corev3.Node) string {
	if strings.HasPrefix(n.GetUserAgentName(), "gRPC ") {
		return grpcKey
	}
	return fleetKey
}

// FleetSource reads the current fleet.
type FleetSource interface {
	Fleet(ctx context.Context) (Fleet, error)
}

// StoreFleet reads the fleet from the node and gateway registrations in Redis: one HGETALL
// each, cheap enough to poll.
type StoreFleet struct {
	Store *store.Store
	// HeartbeatTimeout: a node silent for longer is dead (the placer fails its sessions with
	// host_failure after the same silence) and leaves the fleet, so that Envoy stops sending
	// it connections; its next heartbeat brings it back. Zero means DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// DefaultHeartbeatTimeout is the placer's default: the edge forgets a node when the placer
// declares it dead.
const DefaultHeartbeatTimeout = 10 * time.Second

// Fleet implements FleetSource.
func (s StoreFleet) Fleet(ctx context.Context) (Fleet, error) {
	all, err := s.Store.Nodes(ctx)
	if err != nil {
		return Fleet{}, err
	}
	timeout, now := s.HeartbeatTimeout, time.Now
	if timeout <= 0 {
		timeout = DefaultHeartbeatTimeout
	}
	if s.Now != nil {
		now = s.Now
	}
	nodes := all[:0]
	for _, n := range all {
		if now().Sub(n.HeartbeatAt) <= timeout {
			nodes = append(nodes, n)
		}
	}
	gws, err := s.Store.Gateways(ctx)
	if err != nil {
		return Fleet{}, err
	}
	return FleetFrom(nodes, gws), nil
}

// Config configures a Server.
type Config struct {
	Source  FleetSource
	Options Options
	Logger  *slog.Logger
	// Registerer receives the server's metrics (the gateway's /metrics registry); nil keeps
	// them private.
	Registerer prometheus.Registerer
	// PollEvery is how often the fleet is read (default 2 s).
	PollEvery time.Duration
	// TLS, when set, is what Serve speaks: ADS only over TLS with this configuration (give it
	// ClientAuth RequireAndVerifyClientCert, as wb serve does, for only the fleet's Envoys to
	// read its topology). Nil serves plaintext gRPC.
	TLS *tls.Config
}

// Server publishes the fleet's resources over ADS (state of the world and delta).
type Server struct {
	src       FleetSource
	opts      Options
	log       *slog.Logger
	pollEvery time.Duration
	tls       *tls.Config
	cache     cachev3.SnapshotCache
	xds       serverv3.Server
	metrics   metrics

	mu          sync.Mutex
	current     [5]string // versions of the published snapshot
	published   bool
	lastSkipped string
	// sent is the latest response per stream and type, to recognise what a NACK rejects.
	sent map[streamType]sentResponse
}

type streamType struct {
	stream  int64
	typeURL string
}

type sentResponse struct{ nonce, version string }

type metrics struct {
	nacks      *prometheus.CounterVec
	responses  *prometheus.CounterVec
	published  prometheus.Counter
	failures   *prometheus.CounterVec
	suppressed prometheus.Counter
}

// New builds a server; it publishes nothing until Run or Refresh reads the fleet.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Source == nil {
		return nil, errors.New("xds: Config.Source is required")
	}
	if err := cfg.Options.Validate(); err != nil {
		return nil, fmt.Errorf("xds options: %w", err)
	}
	s := &Server{
		src: cfg.Source, opts: cfg.Options, log: cfg.Logger, pollEvery: cfg.PollEvery, tls: cfg.TLS,
		sent: map[streamType]sentResponse{},
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	// ads=false although everything is served over ADS: in "ADS mode" the cache answers a
	// request only if it names every resource of its type, and a gRPC client asks for just
	// the listener and cluster it needs. Envoy asks for all listeners and clusters anyway.
	s.cache = cachev3.NewSnapshotCache(false, fleetHash{}, cacheLogger{s.log})
	if s.pollEvery <= 0 {
		s.pollEvery = 2 * time.Second
	}
	s.metrics = metrics{
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_xds_nacks_total", Help: "xDS responses a client rejected, by resource type.",
		}, []string{"type"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_xds_responses_total", Help: "xDS responses sent to clients, by resource type.",
		}, []string{"type"}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wb_xds_snapshots_published_total", Help: "Snapshots published because the fleet's resources changed.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wb_xds_snapshot_failures_total", Help: "Fleet reads or snapshots that failed; the last good snapshot stayed. reason: read, invalid.",
		}, []string{"reason"}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wb_xds_nack_resends_suppressed_total", Help: "NACKs whose rejected version was not sent again.",
		}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.metrics.nacks, s.metrics.responses, s.metrics.published, s.metrics.failures, s.metrics.suppressed} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("xds metrics: %w", err)
			}
		}
	}
	s.xds = serverv3.NewServer(ctx, s.cache, s.callbacks())
	return s, nil
}

// Register adds the aggregated discovery service (ADS) to g.
func (s *Server) Register(g *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, s.xds)
}

// Serve serves ADS on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	opts := []grpc.ServerOption{
		// Envoys hold one stream each for hours; keepalives find the dead ones.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(1 << 20),
	}
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	g := grpc.NewServer(opts...)
	s.Register(g)
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			g.Stop() // ADS streams never end by themselves: GracefulStop would wait forever
		case <-done:
		}
	}()
	err := g.Serve(ln)
	close(done)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Run reads the fleet now and every PollEvery until ctx ends, publishing when its resources
// change.
func (s *Server) Run(ctx context.Context) error {
	s.Refresh(ctx)
	t := time.NewTicker(s.pollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Refresh(ctx)
		}
	}
}

// Refresh reads the fleet once and publishes it if its resources changed. On a failed read
// or an invalid snapshot the last good snapshot stays published.
func (s *Server) Refresh(ctx context.Context) error {
	f, err := s.src.Fleet(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		s.metrics.failures.WithLabelValues("read").Inc()
		s.log.Warn("xds: read fleet; keeping the last snapshot", "err", err)
		return err
	}
	return s.apply(ctx, f)
}

func (s *Server) apply(ctx context.Context, f Fleet) error {
	r := Build(f, s.opts)
	if skipped := strings.Join(r.Skipped, "; "); skipped != s.swapSkipped(skipped) && skipped != "" {
		s.log.Warn("xds: fleet members left out", "skipped", r.Skipped)
	}
	return s.publish(ctx, r, BuildGRPC(f, s.opts))
}

func (s *Server) swapSkipped(v string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.lastSkipped
	s.lastSkipped = v
	return old
}

// publish validates r (the Envoys') and g (the gRPC clients', of the same fleet) and sets
// them as the fleet's snapshots unless r's versions are already published (g follows from
// the same fleet and options as r, and changes only when r does).
func (s *Server) publish(ctx context.Context, r, g *Resources) error {
	snap, err := r.Snapshot()
	var grpcSnap *cachev3.Snapshot
	if err == nil {
		grpcSnap, err = g.Snapshot()
	}
	if err != nil {
		s.metrics.failures.WithLabelValues("invalid").Inc()
		s.log.Error("xds: snapshot rejected; keeping the last good one", "err", err)
		return err
	}
	v := versions(snap)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.published && v == s.current {
		return nil
	}
	for _, k := range []struct {
		key  string
		snap *cachev3.Snapshot
	}{{grpcKey, grpcSnap}, {fleetKey, snap}} {
		if err := s.cache.SetSnapshot(ctx, k.key, k.snap); err != nil {
			s.metrics.failures.WithLabelValues("invalid").Inc()
			return fmt.Errorf("xds: set snapshot: %w", err)
		}
	}
	s.current, s.published = v, true
	s.metrics.published.Inc()
	s.log.Info("xds: snapshot published", "lds", v[0], "rds", v[1], "cds", v[2], "eds", v[3], "sds", v[4],
		"clusters", len(r.Clusters))
	return nil
}

// Versions are the published snapshot's versions (LDS, RDS, CDS, EDS, SDS); ok is false
// before the first one.
func (s *Server) Versions() (v [5]string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current, s.published
}

// callbacks log and count NACKs, and keep a rejected version from being sent again.
//
// go-control-plane's snapshot cache answers a state-of-the-world request at once whenever its
// version_info differs from the snapshot's. A NACK carries the last version the client
// accepted, so the cache would send the rejected version straight back, forever
// (envoyproxy/go-control-plane#962). The server calls OnStreamRequest before it asks the cache
// for a watch, with the same request: for a NACK of our latest response on that stream, we
// set its version_info to the rejected version, so the cache holds the watch until a new
// snapshot (new content, new version) exists, and sends that at once if it already does.
// Delta streams need no help: the cache compares per-resource versions with those it sent.
func (s *Server) callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamRequestFunc: func(stream int64, req *discoveryv3.DiscoveryRequest) error {
			if req.GetErrorDetail() == nil {
				return nil
			}
			s.metrics.nacks.WithLabelValues(shortType(req.GetTypeUrl())).Inc()
			s.mu.Lock()
			last, ok := s.sent[streamType{stream, req.GetTypeUrl()}]
			s.mu.Unlock()
			s.log.Warn("xds: NACK", "node", req.GetNode().GetId(), "type", shortType(req.GetTypeUrl()),
				"rejected_version", last.version, "accepted_version", req.GetVersionInfo(), "error", req.GetErrorDetail().GetMessage())
			if ok && last.nonce == req.GetResponseNonce() {
				req.VersionInfo = last.version
				s.metrics.suppressed.Inc()
			}
			return nil
		},
		StreamResponseFunc: func(_ context.Context, stream int64, req *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			s.metrics.responses.WithLabelValues(shortType(resp.GetTypeUrl())).Inc()
			s.mu.Lock()
			s.sent[streamType{stream, resp.GetTypeUrl()}] = sentResponse{nonce: resp.GetNonce(), version: resp.GetVersionInfo()}
			s.mu.Unlock()
		},
		StreamClosedFunc: func(stream int64, _ *corev3.Node) {
			s.mu.Lock()
			for k := range s.sent {
				if k.stream == stream {
					delete(s.sent, k)
				}
			}
			s.mu.Unlock()
		},
		StreamDeltaRequestFunc: func(_ int64, req *discoveryv3.DeltaDiscoveryRequest) error {
			if req.GetErrorDetail() != nil {
				s.metrics.nacks.WithLabelValues(shortType(req.GetTypeUrl())).Inc()
				s.log.Warn("xds: NACK (delta)", "node", req.GetNode().GetId(), "type", shortType(req.GetTypeUrl()),
					"nonce", req.GetResponseNonce(), "error", req.GetErrorDetail().GetMessage())
			}
			return nil
		},
		StreamDeltaResponseFunc: func(_ int64, _ *discoveryv3.DeltaDiscoveryRequest, resp *discoveryv3.DeltaDiscoveryResponse) {
			s.metrics.responses.WithLabelValues(shortType(resp.GetTypeUrl())).Inc()
		},
	}
}

// shortType is a type URL's message name, for labels and logs.
func shortType(typeURL string) string {
	return typeURL[strings.LastIndexByte(typeURL, '.')+1:]
}

// cacheLogger passes go-control-plane's log lines to slog (its debug lines at debug level).
type cacheLogger struct{ log *slog.Logger }

func (l cacheLogger) Debugf(format string, args ...any) { l.at(slog.LevelDebug, format, args) }
func (l cacheLogger) Infof(format string, args ...any)  { l.at(slog.LevelDebug, format, args) }
func (l cacheLogger) Warnf(format string, args ...any)  { l.at(slog.LevelWarn, format, args) }
func (l cacheLogger) Errorf(format string, args ...any) { l.at(slog.LevelError, format, args) }

func (l cacheLogger) at(level slog.Level, format string, args []any) {
	if l.log.Enabled(context.Background(), level) { // the cache logs every request at debug
		l.log.Log(context.Background(), level, "xds cache: "+fmt.Sprintf(format, args...))
	}
}
