//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"wb/desktop"
	"wb/desktop/guest"
	"wb/gateway"
	"wb/hypervisor/templates"
	"wb/internal/datadir"
	"wb/internal/fleet"
	"wb/internal/mtls"
	"wb/internal/netguard"
	"wb/internal/stallwrite"
	"wb/node"
	nodeclient "wb/node/client"
	"wb/placer"
	"wb/quota"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// defaultNodeTimeout: the contract fails a dead host's sessions within 10 s of its death. A
// node is found dead this long after its last heartbeat, then the placer fails its sessions:
// measured in a fleet (conformance/chaos), 10 s here gave 9.8 s, at the bound; 7 s (three
// missed heartbeats and a half) leaves room on a loaded machine.
const defaultNodeTimeout = 7 * time.Second

type serveFlags struct {
	addr      string
	redisURL  string
	redisCA   string
	publicURL string
	adminKey  string
	apiKey    string
	region    string
	logLevel  string
	prices    string
	node      nodeFlags

	allowPrivateWebhooks bool
	// webhookMaxBackoff caps the wait between two attempts of a delivery: an endpoint back
	// from an outage gets its events at most about this long after.
	webhookMaxBackoff time.Duration
	desktopIdle       time.Duration
	// metricsToken is a second bearer token for /metrics; metricsAddr serves /metrics on an
	// operator-only address instead of the API's.
	metricsToken  string
	metricsAddr   string
	nodeTokenFile string
	tls           tlsFlags
	authzAddr     string // ext_authz gRPC for the Envoy fleet (serve_authz.go)
	edgeAddr      string // the API for the Envoy fleet over mutual TLS
	// nodeTimeout: a node silent for longer is dead, and its sessions fail with host_failure.
	nodeTimeout time.Duration
	xds         xdsFlags
	// fleetTLS is this gateway's certificate inside the fleet: it serves ext_authz with it and
	// presents it to the nodes.
	fleetTLS fleetTLSFlags
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wb serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8080", "`host:port` to listen on; 127.0.0.1:0 picks a free port")
	fs.StringVar(&f.redisURL, "redis", os.Getenv("WB_REDIS_URL"), "Redis `URL` (default $WB_REDIS_URL, which keeps a password out of ps): redis://[user:password@]host:port/0, rediss://… for TLS, or redis://user:password@h1:p1,h2:p2,h3:p3 for a Cluster; empty starts a redis-server of wb's own on a Unix socket in <data-dir>/redis, with a random password, whose state ends with the process")
	fs.StringVar(&f.redisCA, "redis-ca", "", "PEM `file` of the CA that signed a rediss:// server's certificate (default: the system's roots)")
	fs.StringVar(&f.publicURL, "public-url", "", "base `URL` callers use to reach this server, for connect URLs (default http://ADDR)")
	fs.StringVar(&f.adminKey, "admin-key", os.Getenv("WB_ADMIN_KEY"), "admin `key` for /v1/admin routes (default $WB_ADMIN_KEY, else random)")
	fs.StringVar(&f.apiKey, "api-key", os.Getenv("WB_API_KEY"), "API `key` bound to the dev project (default $WB_API_KEY, else random)")
	fs.StringVar(&f.region, "region", "local", "`name` of the region this machine serves")
	fs.StringVar(&f.logLevel, "log-level", "info", "log `level`: debug, info, warn, error")
	f.node.register(fs)
	f.tls.register(fs)
	fs.StringVar(&f.prices, "prices", "", "JSON price `file` (see quota/PRICES.md); empty uses the defaults")
	fs.BoolVar(&f.allowPrivateWebhooks, "allow-private-webhooks", false, "let webhook URLs resolve to loopback and private addresses, for testing with a receiver on this machine; by default they must be public")
	fs.DurationVar(&f.webhookMaxBackoff, "webhook-max-backoff", webhooks.DefaultMaxBackoff, "longest wait between two attempts of a webhook delivery (waits start at 5 s and double): an endpoint back from an outage gets its events at most about this long after (1s–24h)")
	fs.DurationVar(&f.desktopIdle, "desktop-idle", gateway.DefaultDesktopIdle, "how long a desktop may go unused (no MCP call, file sent or saved, visible console) before it sleeps (1s to just under the sessions' longest idle timeout)")
	fs.StringVar(&f.metricsToken, "metrics-token", os.Getenv("WB_METRICS_TOKEN"), "bearer `token` a scraper may send to /metrics besides the admin key (default $WB_METRICS_TOKEN)")
	fs.StringVar(&f.nodeTokenFile, "node-token-file", "", "`file` holding the token this gateway sends to every node (else $WB_NODE_TOKEN; else a random one, which only the embedded node knows): give separate `wb node`s the same token")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "`host:port` serving /metrics without a key, for the operator's network only; the API then answers 404 for /metrics")
	fs.StringVar(&f.authzAddr, "authz-addr", "", "`host:port` serving ext_authz (gRPC envoy.service.auth.v3.Authorization) to an Envoy fleet, on the operator's network only; recorded in this gateway's registration for xds; empty serves none")
	fs.StringVar(&f.edgeAddr, "edge-addr", "", "`host:port` serving this gateway's API to an Envoy fleet over mutual TLS only (needs --fleet-tls-*: clients must present a certificate --fleet-tls-ca signed), on the operator's network; recorded in this gateway's registration, and the Envoys' endpoint for it when they speak TLS (--envoy-tls-*); empty serves none")
	fs.DurationVar(&f.nodeTimeout, "node-timeout", defaultNodeTimeout, "how long a node may go without a heartbeat (every 2 s) before it counts as dead and its sessions fail with host_failure, and the edge stops sending it connections (3s–5m)")
	f.xds.register(fs)
	f.fleetTLS.register(fs, "Serves --authz-addr (ext_authz) and --edge-addr (the API for the Envoys) over TLS only, to clients whose certificate --fleet-tls-ca signed for the Envoy role, spiffe://wb/envoy (the Envoys, --envoy-tls-*); and this gateway presents it to the nodes registered with https:// URLs (wb node --fleet-tls-*), whose certificates the CA must have signed for the node role. It must name the gateway role, spiffe://wb/gateway")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: wb serve [flags]

Runs the whole platform on this machine: the HTTP API, the placer and the webhook
dispatcher. On start it prints three lines to stdout, for eval:
  WB_URL=http://HOST:PORT   (https:// with --tls-domain)
  WB_API_KEY=...    (the dev project's key)
  WB_ADMIN_KEY=...
Logs go to stderr. SIGINT or SIGTERM stops it cleanly.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("wb serve takes no arguments, got %q", fs.Args())
	}
	if err := f.tls.check(); err != nil {
		return err
	}
	if err := f.node.check(); err != nil {
		return err
	}
	// Below three heartbeat periods, one late heartbeat of a loaded node would fail its sessions.
	if f.nodeTimeout < 3*time.Second || f.nodeTimeout > 5*time.Minute {
		return fmt.Errorf("--node-timeout %s: must be 3s–5m (nodes heartbeat every 2 s)", f.nodeTimeout)
	}
	// Below a second, a dead endpoint would be hammered; above the 24 h retry window, a
	// delivery would get no second attempt.
	if f.webhookMaxBackoff < time.Second || f.webhookMaxBackoff > 24*time.Hour {
		return fmt.Errorf("--webhook-max-backoff %s: must be 1s–24h", f.webhookMaxBackoff)
	}
	// Above the sessions' longest idle timeout, the node would stop an unused desktop's
	// session before the desktop sleeps.
	if f.desktopIdle < time.Second || f.desktopIdle > time.Duration(session.IdleTimeoutMaxS-60)*time.Second {
		return fmt.Errorf("--desktop-idle %s: must be 1s–%s", f.desktopIdle, time.Duration(session.IdleTimeoutMaxS-60)*time.Second)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	// Before anything reads or writes the data dir: a second instance on it would reap the
	// first one's guests as orphans.
	lock, err := datadir.Acquire(f.node.dataDir, "wb serve")
	if err != nil {
		return err
	}
	defer lock.Release()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	// Before anything loads TLS files, so that each reports its expiry and failed reloads;
	// registered with the gateway's metrics once they exist.
	tlsMetrics := mtls.NewMetrics()
	f.fleetTLS.metrics = tlsMetrics
	var nodeOpts []nodeclient.Option
	if f.fleetTLS.enabled() { // the files are checked before anything starts
		d, err := nodeDialer(f.fleetTLS, log)
		if err != nil {
			return err
		}
		nodeOpts = append(nodeOpts, nodeclient.WithDialTLS(d.DialTLSContext))
	}

	rdb, closeRedis, err := openRedis(ctx, f.redisURL, f.redisCA, filepath.Join(f.node.dataDir, "redis"))
	if err != nil {
		return err
	}
	defer closeRedis()
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = rdb.Ping(pingCtx).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("--redis %s: %w", redisLabel(f.redisURL), err)
	}

	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	var metricsLn net.Listener
	if f.metricsAddr != "" {
		if metricsLn, err = net.Listen("tcp", f.metricsAddr); err != nil {
			ln.Close()
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		defer metricsLn.Close() // on the error paths; Shutdown closes it otherwise
	}
	authzLn, err := listenAuthz(f.authzAddr)
	if err != nil {
		ln.Close()
		return err
	}
	edgeLn, err := listenEdge(f.edgeAddr, f.fleetTLS, log)
	if err != nil {
		ln.Close()
		return err
	}
	edgeAddr := ""
	if edgeLn != nil {
		defer edgeLn.Close() // on the error paths; Shutdown closes it otherwise
		edgeAddr = edgeLn.Addr().String()
	}
	authzAddr := ""
	if authzLn != nil {
		defer authzLn.Close() // on the error paths; the gRPC server closes it otherwise
		authzAddr = authzLn.Addr().String()
	}
	url := f.tls.scheme() + "://" + ln.Addr().String()
	if f.publicURL == "" {
		f.publicURL = url
	}
	tiers := f.node.coldP95.tiers() // the store, the placer and the gateway agree on them
	st := store.New(rdb, store.WithTiers(tiers))
	if f.adminKey == "" {
		f.adminKey = store.NewAPIKey("wb_admin_")
	}
	dev, err := st.EnsureProject(ctx, "proj_dev", "dev")
	if err != nil {
		ln.Close()
		return fmt.Errorf("dev project: %w", err)
	}
	if f.apiKey == "" {
		f.apiKey = store.NewAPIKey("wb_live_")
	}
	if err := st.AddAPIKey(ctx, dev.ID, f.apiKey); err != nil {
		ln.Close()
		return err
	}

	// The embedded node serves its API on a loopback port, as a remote `wb node` would.
	nodeLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ln.Close()
		return err
	}
	f.node.id, f.node.region, f.node.zone = fleet.ServeNodeID, f.region, f.region+"-a"
	nd, tpls, err := buildNode(ctx, f.node, st, "http://"+nodeLn.Addr().String(), log)
	if err != nil {
		ln.Close()
		nodeLn.Close()
		return err
	}
	if nd != nil {
		defer releaseRunDir(nd.Driver, log) // after nd.DestroyAll or nd.Close, deferred below
	}
	// The token this gateway sends to every node: separate `wb node`s must be given it too.
	nodeToken := os.Getenv("WB_NODE_TOKEN")
	if f.nodeTokenFile != "" {
		if nodeToken, err = readTokenFile("--node-token-file", f.nodeTokenFile); err != nil {
			ln.Close()
			nodeLn.Close()
			return fmt.Errorf("wb serve %w", err)
		}
	}
	if nodeToken == "" {
		nodeToken = store.NewAPIKey("wb_node_") // only the embedded node knows it
	}
	nodes := nodeclient.New(st, nodeToken, nodeOpts...)
	prices := quota.DefaultPrices()
	if f.prices != "" {
		if prices, err = quota.LoadPrices(f.prices); err != nil {
			ln.Close()
			nodeLn.Close()
			return fmt.Errorf("--prices: %w", err)
		}
	}
	metrics := gateway.NewMetrics(st)
	metrics.Registry().MustRegister(tlsMetrics)
	pol, plug, err := decisionPoints(ctx, rdb, f.node.dataDir, f.node.pluginTimeout, metrics.Registry(), log)
	if err != nil {
		ln.Close()
		nodeLn.Close()
		return err
	}
	defer pol.Close(context.WithoutCancel(ctx))
	defer plug.Close(context.WithoutCancel(ctx))
	if nd != nil {
		nd.Runtime = runtimeChecker{pol, plug, log}
	}
	accounts := quota.NewAccounts(rdb)
	enforcer := &quota.Enforcer{Store: st, Accounts: accounts, Stopper: nodes, Decide: spendDecider(pol, plug, log), Logger: log}
	settler := quota.NewSettler(rdb, quota.SettlerOptions{Prices: prices, Caps: quota.NewCaps(rdb, enforcer.OnCap, log), Enforcer: enforcer, Logger: log})
	pl := placer.New(placer.Config{Store: st, Provisioner: nodes, Tiers: tiers, HeartbeatTimeout: f.nodeTimeout, Logger: log})
	webhookGuard, err := netguard.New(netguard.Options{Logger: log})
	if err != nil {
		ln.Close()
		nodeLn.Close()
		return err
	}
	platform := &platformAddrs{guards: []*netguard.Guard{webhookGuard}, st: st, rdb: rdb, gateways: []string{url, f.publicURL},
		nodes: []string{nodeLn.Addr().String()}, log: log}
	if nd != nil {
		platform.guards = append(platform.guards, nd.Egress)
	}
	platform.refresh(ctx)
	reg := webhooks.NewRegistry(rdb, webhooks.RegistryOptions{AllowPrivate: f.allowPrivateWebhooks, Guard: webhookGuard})
	disp := webhooks.NewDispatcher(rdb, reg, webhooks.Options{Logger: log, Backoff: webhooks.BackoffUpTo(f.webhookMaxBackoff)})
	var guests gateway.Guests = nodes
	if nd != nil {
		guests = embeddedGuests{nodeID: nd.Info.ID, local: nd.Local(), remote: nodes}
	}
	gw, err := gateway.New(gateway.Config{
		Store: st, Limiter: quota.NewRateLimiter(rdb), Accounts: accounts, Webhooks: reg,
		Guests: guests, Catalog: node.CatalogOf(tpls), Regions: []string{f.region}, PublicURL: strings.TrimRight(f.publicURL, "/"),
		AdminKey: f.adminKey, Logger: log, Metrics: metrics, Policies: pol, Plugins: plug,
		MetricsToken: f.metricsToken, MetricsElsewhere: f.metricsAddr != "", Tiers: tiers,
		DesktopIdle: f.desktopIdle, DesktopSetup: desktopSetup(tpls), NodeTimeout: f.nodeTimeout,
	})
	if err != nil {
		ln.Close()
		return err
	}
	defer gw.Close()
	var authz *grpc.Server
	if authzLn != nil {
		if authz, err = authzServer(ctx, gw, f.fleetTLS, log); err != nil {
			return err
		}
	}
	runXDS, err := listenXDS(ctx, f.xds, f.nodeTimeout, st, metrics.Registry(), tlsMetrics, log)
	if err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	if f.tls.enabled() {
		tlsLn, stopTLS, err := f.tls.listen(ctx, ln, st, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer stopTLS()
		ln = tlsLn
	}

	fmt.Fprintf(stdout, "WB_URL=%s\nWB_API_KEY=%s\nWB_ADMIN_KEY=%s\n", url, f.apiKey, f.adminKey)
	log.Info("wb serve ready", "url", url, "redis", redisLabel(f.redisURL))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		registerGateway(gctx, st, session.NewID("gw_", time.Now()), []string{url, f.publicURL}, authzAddr, edgeAddr, log)
		return nil
	})
	g.Go(func() error { return pl.Run(gctx) })
	g.Go(func() error { return disp.Run(gctx) })
	g.Go(func() error { return settler.Run(gctx) })
	runXDS(gctx, g)
	if nd != nil {
		runNode(gctx, g, nd, nodeLn, nodeToken, platform)
		if f.redisURL == "" {
			// Embedded Redis: the sessions end with the process, so must their guests.
			defer nd.DestroyAll(context.WithoutCancel(ctx))
		} else {
			defer nd.Close(context.WithoutCancel(ctx))
		}
	} else {
		nodeLn.Close()
		g.Go(func() error { platform.run(gctx); return nil })
	}
	serveUntil(gctx, g, srv, ln, 10*time.Second)
	if authz != nil {
		serveAuthz(gctx, g, authz, authzLn, 10*time.Second, f.fleetTLS.enabled(), log)
	}
	if edgeLn != nil {
		log.Info("edge API served", "addr", edgeAddr)
		serveUntil(gctx, g, &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}, edgeLn, 10*time.Second)
	}
	if metricsLn != nil {
		serveMetrics(gctx, g, metricsLn, metrics.Handler(), gw.WriteStall, log)
	}
	g.Go(func() error { <-gctx.Done(); log.Info("shutting down"); return nil })
	return g.Wait()
}

// serveUntil serves srv on ln in g until ctx ends, then shuts it down, giving requests in
// flight up to grace to finish. Its connections queue little unsent (stallwrite.ConnContext),
// so that the answers' stall bound cuts callers that stopped, not those that read slowly.
func serveUntil(ctx context.Context, g *errgroup.Group, srv *http.Server, ln net.Listener, grace time.Duration) {
	if srv.ConnContext == nil {
		srv.ConnContext = stallwrite.ConnContext
	}
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		return srv.Shutdown(sctx)
	})
}

// serveMetrics serves /metrics on ln, an address only the operator's network reaches, until
// ctx ends. Every write of an answer, the scrape's and net/http's last ones once it returned,
// waits at most stall on a caller that takes none of it: one that asks on a connection and
// reads no more would otherwise hold the connection, its goroutine and the answer for as
// long as it stayed.
func serveMetrics(ctx context.Context, g *errgroup.Group, ln net.Listener, h http.Handler, stall time.Duration, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := stallwrite.New(w, stall)
		defer sw.Close()
		h.ServeHTTP(sw, r)
	}))
	srv := &http.Server{Handler: stallwrite.Handler(mux, stall), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	log.Info("metrics served", "url", "http://"+ln.Addr().String()+"/metrics")
	serveUntil(ctx, g, srv, ln, 5*time.Second)
}

// desktopSetup starts a desktop's display and browser after each fresh start, when this node
// offers tpl_desktop (the gateway then gives desktops that template); nil otherwise.
func desktopSetup(tpls templates.Catalog) func(context.Context, desktop.Execer) error {
	if _, ok := tpls[guest.Template]; !ok {
		return nil
	}
	return func(ctx context.Context, ex desktop.Execer) error { return guest.Start(ctx, ex) }
}
