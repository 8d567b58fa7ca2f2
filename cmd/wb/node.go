//go:build linux

package main

import (
	"context"
	"debug/elf"
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

	"wb/desktop/guest"
	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/datadir"
	"wb/internal/mtls"
	"wb/internal/netguard"
	"wb/node"
	"wb/plugins"
	"wb/snapstore"
	"wb/store"
)

// nodeFlags configure a node, in `wb node` and in `wb serve`.
type nodeFlags struct {
	id, region, zone string
	runtime, dataDir string
	pool, vcpu, mem  int
	// desktopPool sizes tpl_desktop's pool apart: its warm-up starts a browser (-1: --pool).
	desktopPool int
	// runPool and runPoolMax size the run pools: warm guests whose interpreter waits for a run
	// (-1: --pool).
	runPool     int
	runPoolMax  int
	egressAllow cidrFlag
	coldP95     coldP95Flag
	// allowUnlimitedDisk starts guests without a disk limit when the host cannot enforce one.
	allowUnlimitedDisk bool
	// backend picks the guest driver: oci (--runtime) or cloudhv (--ch-binary, --kernel).
	backend, chBinary, kernel, initramfs string
	// agentBin is the static binary put in every guest as its agent ("" : this executable).
	agentBin string
	// snapshotStore is the object store URL snapshots go to ("": the data dir alone).
	snapshotStore string
	// pluginTimeout is the deadline of one call into a tenant's Wasm plugin.
	pluginTimeout time.Duration
	// metrics, when not nil, is the node's metrics (wb node --metrics-addr).
	metrics *node.Metrics
}

// check refuses flag values out of range, naming the flag.
func (f *nodeFlags) check() error {
	if f.pluginTimeout < time.Millisecond || f.pluginTimeout > plugins.MaxTimeout {
		return fmt.Errorf("--plugin-timeout %s: must be 1ms–%s", f.pluginTimeout, plugins.MaxTimeout)
	}
	return nil
}

func (f *nodeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.runtime, "runtime", "auto", "guest `runtime`: runsc (gVisor), runc, auto (runsc if installed, else runc) or none (no node: sessions stay pending)")
	fs.StringVar(&f.dataDir, "data-dir", "/var/lib/wb", "`dir` of this instance alone (it is locked): templates, guests, snapshots, the runtime's state, the node's journal")
	fs.IntVar(&f.pool, "pool", 1, "warm guests to keep per template (size class s)")
	fs.IntVar(&f.runPool, "run-pool", -1, "warm guests to keep per runtime with a runner (python3) for ephemeral runs (POST /v1/runs), the runtime's interpreter started and waiting for the code (a python run several times faster); 0: none, runs start their interpreter; -1: as --pool")
	fs.IntVar(&f.runPoolMax, "run-pool-max", 8, "most warm guests a runtime's run pool grows to with the rate of runs (within the node's free capacity); at most --run-pool keeps it fixed")
	fs.IntVar(&f.desktopPool, "desktop-pool", -1, "warm small desktops to keep, their display and browser already started (each costs a browser's start in CPU); -1: as --pool")
	fs.IntVar(&f.vcpu, "vcpu", 64, "vCPUs this node offers to guests")
	fs.IntVar(&f.mem, "memory-mib", 1<<20, "memory (MiB) this node offers to guests")
	fs.Var(&f.egressAllow, "egress-allow-cidr", "`CIDR` that guests whose policy allows egress may reach although it is not public (say 10.20.0.0/16 for a private package mirror); repeatable. Loopback opens only for a prefix inside 127.0.0.0/8 or ::1; the platform's own addresses (this host, Redis, gateways, nodes) never open")
	fs.Var(&f.coldP95, "cold-p95", "`TIER=DURATION`: a tier's cold-start p95 as this deployment measures it, from which its provisioning deadline follows (3×); repeatable, say 2=5s (default 1=2s, 2=3s, 3=5s, 4=10s)")
	fs.StringVar(&f.backend, "backend", "oci", "guest `back end`: oci (containers, see --runtime) or cloudhv (Cloud Hypervisor microVMs: needs --ch-binary and --kernel)")
	fs.StringVar(&f.chBinary, "ch-binary", "", "cloud-hypervisor `executable` for --backend cloudhv")
	fs.StringVar(&f.kernel, "kernel", "", "guest kernel `file` for --backend cloudhv (wb image build writes DIR/vmlinuz)")
	fs.StringVar(&f.initramfs, "initramfs", "", "guest initramfs `file` for --backend cloudhv (wb image build writes DIR/initramfs.img)")
	fs.StringVar(&f.agentBin, "agent-bin", "", "static `binary` that runs as every guest's agent: wb-agent (make build writes bin/wb-agent) or wb itself; default: wb-agent beside this executable, else this executable")
	fs.StringVar(&f.snapshotStore, "snapshot-store", "", "`URL` of the object store snapshots are uploaded to, so that any node can restore them: s3://BUCKET[/PREFIX]?endpoint=http://HOST:PORT&region=REGION (credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) or file:///SHARED/DIR; the node keeps a bounded cache. Default: none, snapshots stay in the data dir and restore on this node only")
	fs.DurationVar(&f.pluginTimeout, "plugin-timeout", plugins.DefaultTimeout, "deadline of one call into a tenant's Wasm plugin, unless the project's plan sets its own (1ms–10s); a plugin past it is a timeout, which denies unless the plugin fails open. Raise it on hosts where a loaded CPU can hold a call that long")
	fs.BoolVar(&f.allowUnlimitedDisk, "allow-unlimited-disk", false, "start guests without a disk limit when this host cannot make their ext4 loop images (default: such guests fail to start)")
}

// buildNode assembles the templates and the node. It answers a nil node for --runtime none.
// A node answered is to be ended with releaseRunDir, after its guests that end with it.
func buildNode(ctx context.Context, f nodeFlags, st *store.Store, addr string, log *slog.Logger) (_ *node.Node, _ templates.Catalog, err error) {
	tplDir := filepath.Join(f.dataDir, "templates")
	cat, err := templates.Assemble(tplDir)
	if err != nil {
		return nil, nil, fmt.Errorf("templates in %s: %w", tplDir, err)
	}
	if f.runtime == "none" {
		return nil, cat, nil
	}
	drv, err := newDriver(f, log)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			releaseRunDir(drv, log)
		}
	}()
	agentBin, err := agentBinary(f.agentBin)
	if err != nil {
		return nil, nil, err
	}
	if self, err := os.Executable(); err == nil && f.agentBin == "" {
		if _, _, whole := defaultAgent(self); whole {
			log.Warn("guests run this whole wb as their agent: no wb-agent beside it; each guest's start costs some 60 ms more CPU under runsc than with wb-agent (make build writes bin/wb-agent beside bin/wb; or name one with --agent-bin)", "agent", agentBin)
		}
	}
	pools := append(warmPools(cat.Names(), f.pool, f.desktopPool), node.RunnerPools(cat, f.runPoolSize(), f.runPoolMax)...)
	guard, err := netguard.New(netguard.Options{Allow: f.egressAllow.prefixes, Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("--egress-allow-cidr: %w", err)
	}
	var snapshots *snapstore.Store
	if f.snapshotStore != "" {
		if snapshots, err = snapstore.Open(ctx, f.snapshotStore, os.Getenv); err != nil {
			return nil, nil, fmt.Errorf("--snapshot-store: %w", err)
		}
	}
	nd, err := node.New(node.Config{
		Snapshots: snapshots,
		Store:     st, Driver: drv, Templates: cat, DataDir: filepath.Join(f.dataDir, "node"), AgentBin: agentBin, Egress: guard,
		Info: store.NodeInfo{ID: f.id, Addr: addr, Region: f.region, Zone: f.zone,
			Tiers: []int{1, 2, 3, 4}, VCPU: f.vcpu, MemoryMiB: f.mem},
		Pools: pools, Tiers: f.coldP95.tiers(), Logger: log, Metrics: f.metrics,
	})
	if err != nil {
		return nil, nil, err
	}
	log.Info("node ready", "id", f.id, "backend", drv.Name(), "addr", addr, "templates", cat.Names())
	return nd, cat, nil
}

// guestsCgroup is the cgroup of every oci guest on the host, whichever node's.
const guestsCgroup = "/wb"

// newDriver makes the guest back end --backend names. Runtime state and cgroups belong to
// the data dir, so that two nodes on one host never see (or reap) each other's guests.
func newDriver(f nodeFlags, log *slog.Logger) (hypervisor.Driver, error) {
	switch f.backend {
	case "", "oci":
		if f.chBinary != "" || f.kernel != "" || f.initramfs != "" {
			return nil, errors.New("--ch-binary, --kernel and --initramfs are for --backend cloudhv; add it, or drop them")
		}
		rt := f.runtime
		if rt == "auto" {
			rt = ""
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Every node's guests on the host are under /wb, where the driver caps their total.
		drv, l, err := oci.OpenDataDir(ctx, oci.Options{Runtime: rt, GuestsCgroup: guestsCgroup, CgroupParent: guestsCgroup + "/" + datadir.CgroupName(f.dataDir, f.id),
			Logger: log, AllowUnlimitedDisk: f.allowUnlimitedDisk}, f.dataDir, oci.RunDirBytes)
		if err != nil {
			return nil, fmt.Errorf("--runtime %s: %w (install runsc or runc, or pass --runtime none)", f.runtime, err)
		}
		if l.RunDir == "" {
			log.Info("guests of an earlier node run on the data dir's disk: this node drives them there, and moves its runtime state to a tmpfs at a start that finds none", "state", l.StateRoot)
		}
		return drv, nil
	case "cloudhv":
		drv, err := cloudhv.New(context.Background(), cloudhv.Options{Binary: f.chBinary, Kernel: f.kernel, Initramfs: f.initramfs,
			StateDir: filepath.Join(f.dataDir, "cloudhv"), CacheDir: filepath.Join(f.dataDir, "cloudhv-cache"),
			CgroupParent: "/wb-cloudhv/" + datadir.CgroupName(f.dataDir, f.id), Logger: log})
		if err != nil {
			return nil, fmt.Errorf("--backend cloudhv: %w", err)
		}
		return drv, nil
	default:
		return nil, fmt.Errorf("--backend %q: want oci or cloudhv", f.backend)
	}
}

// runNode serves the node's API and the edge's data path on ln and runs the node until ctx
// ends, keeping the platform's addresses denied to its guests current. Over mutual TLS the
// node API answers only the gateways' certificates (gatewaysOnly), the data path the Envoys'
// too.
func runNode(ctx context.Context, g *errgroup.Group, nd *node.Node, ln net.Listener, token string, platform *platformAddrs) {
	// gatewaysOnly outside learnGateways: an Envoy's certificate with the node token is
	// refused before its address is taken for a gateway's (and on /healthz, which it
	// reaches, learnGateways takes only a gateway's certificate).
	edge, err := edgeDataPath(nd, gatewaysOnly(platform.learnGateways(nd.Handler(token), token), nd.Logger))
	if err != nil {
		g.Go(func() error { return err }) // fails the group: the process ends with err
		return
	}
	srv := &http.Server{Handler: edge.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	g.Go(func() error { <-ctx.Done(); edge.Close(); return nil })
	g.Go(func() error { platform.run(ctx); return nil })
	g.Go(func() error { return nd.Run(ctx) })
	serveUntil(ctx, g, srv, ln, 5*time.Second)
}

// releaseRunDir unmounts the run dir of drv, an oci driver's (newDriver), when no guest is
// left in it: nothing there would be adopted by the node's next start. Called once the node
// has ended, and after the guests that end with it (its warm pool's, Node.Close; every one,
// Node.DestroyAll): at the end of Run they are all still there.
func releaseRunDir(drv hypervisor.Driver, log *slog.Logger) {
	d, ok := drv.(*oci.Driver)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.ReleaseRunDir(ctx); err != nil {
		log.Warn("node: run dir left mounted", "err", err)
	}
}

// agentBinary is the guests' agent: path (--agent-bin), else wb-agent beside this executable
// (a release ships both; make build writes bin/wb-agent), else this executable. It must be a
// static binary: a bare guest has no dynamic loader to run anything else.
func agentBinary(path string) (string, error) {
	flagName := "--agent-bin " + path
	if path == "" {
		self, err := os.Executable()
		if err != nil {
			return "", err
		}
		path, flagName, _ = defaultAgent(self)
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: guests cannot run it as their agent: %w", flagName, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%s is dynamically linked, and guests need a static agent: build it with CGO_ENABLED=0 (make build does), or name a static one with --agent-bin", flagName)
		}
	}
	return path, nil
}

// defaultAgent is the agent of a node given no --agent-bin, whose executable is self: the
// wb-agent beside it, else self (whole: the whole wb as every guest's agent, whose start
// under gVisor costs some 60 ms of CPU more a guest than wb-agent's, for its package inits).
func defaultAgent(self string) (path, name string, whole bool) {
	if beside := filepath.Join(filepath.Dir(self), "wb-agent"); fileExists(beside) {
		return beside, "the wb-agent beside wb (" + beside + ")", false
	}
	return self, "this wb (" + self + ")", true
}

func fileExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// nodeCmd is `wb node`: one host's guests, registered in a shared Redis.
func nodeCmd(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("wb node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f nodeFlags
	f.register(fs)
	redisURL := fs.String("redis", os.Getenv("WB_REDIS_URL"), "Redis `URL` shared with the control plane (required; default $WB_REDIS_URL, which keeps a password out of ps): redis://[user:password@]host:port/0, rediss://… for TLS, or a Cluster's redis://user:password@h1:p1,h2:p2,h3:p3")
	redisCA := fs.String("redis-ca", "", "PEM `file` of the CA that signed a rediss:// server's certificate (default: the system's roots)")
	addr := fs.String("addr", "127.0.0.1:7070", "`host:port` of the node API")
	advertise := fs.String("advertise", "", "`URL` the control plane uses to reach the node API (default http://ADDR)")
	fs.String("token", "", "refused: a token on the command line shows in ps and /proc to every user of the host; use --token-file or $WB_NODE_TOKEN")
	tokenFile := fs.String("token-file", "", "`file` holding the bearer token the control plane sends (else $WB_NODE_TOKEN; one is required)")
	level := fs.String("log-level", "info", "log `level`: debug, info, warn, error")
	metricsAddr := fs.String("metrics-addr", "", "`host:port` serving /metrics (Prometheus: the node's guests, its execs, PTYs and file requests, its edge data path's requests by route, its fleet TLS files' expiry) without a key, for the operator's network only; empty serves none. The node API never serves /metrics")
	fs.StringVar(&f.id, "id", hostnameOr("node_1"), "node `id`")
	fs.StringVar(&f.region, "region", "local", "`region` this node serves")
	fs.StringVar(&f.zone, "zone", "local-a", "`zone` of this node")
	var fleetTLS fleetTLSFlags
	fleetTLS.register(fs, "Serves --addr (the node API and the edge's exec, PTY and files) over TLS only, to clients whose certificate --fleet-tls-ca signed, by their role: the Envoys' (spiffe://wb/envoy, wb serve --envoy-tls-*) call the edge's exec, PTY and files and /healthz only, and are answered 403 elsewhere; the gateways' (spiffe://wb/gateway, wb serve --fleet-tls-*) call all of it, the node API with the node token; --advertise is then https://IP:PORT, and the certificate must name that IP and the node role, spiffe://wb/node")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: wb node --redis URL --token-file FILE [flags]\n\nRuns guests for the control plane: registers in Redis, keeps warm pools, enforces\ntimers (even while Redis is away), and serves exec, PTY and files.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := f.check(); err != nil {
		return err
	}
	onCommandLine := false
	fs.Visit(func(f *flag.Flag) { onCommandLine = onCommandLine || f.Name == "token" })
	token, err := nodeToken(onCommandLine, *tokenFile, os.Getenv("WB_NODE_TOKEN"))
	if err != nil {
		return err
	}
	if *redisURL == "" {
		fs.Usage()
		return errors.New("wb node needs --redis")
	}
	if fleetTLS.enabled() {
		if err := fleetTLS.files().Check(); err != nil {
			return err
		}
	}
	if fleetTLS.enabled() && *advertise != "" && !strings.HasPrefix(*advertise, "https://") {
		return fmt.Errorf("--advertise %s: with --fleet-tls-* the node serves https only; advertise https://IP:PORT", *advertise)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	// Before anything reads or writes the data dir: a second node on it would reap the first
	// one's guests as orphans.
	lock, err := datadir.Acquire(f.dataDir, "wb node")
	if err != nil {
		return err
	}
	defer lock.Release()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	rdb, closeRedis, err := openRedis(ctx, *redisURL, *redisCA, "")
	if err != nil {
		return err
	}
	defer closeRedis()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	var metricsLn net.Listener
	if *metricsAddr != "" {
		if metricsLn, err = net.Listen("tcp", *metricsAddr); err != nil {
			ln.Close()
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		defer metricsLn.Close() // on the error paths; Shutdown closes it otherwise
		// Registered before the listener's TLS files load, which then report to them.
		f.metrics = node.NewMetrics()
		fleetTLS.metrics = mtls.NewMetrics()
		f.metrics.Registry().MustRegister(fleetTLS.metrics)
	}
	servedLn, scheme, err := nodeListener(ln, fleetTLS, log)
	if err != nil {
		ln.Close()
		return err
	}
	ln = servedLn
	if *advertise == "" {
		*advertise = scheme + "://" + ln.Addr().String()
	}
	st := store.New(rdb, store.WithTiers(f.coldP95.tiers()))
	nd, _, err := buildNode(ctx, f, st, *advertise, log)
	if err != nil {
		ln.Close()
		return err
	}
	if nd != nil {
		defer releaseRunDir(nd.Driver, log) // after nd.Close, below
	}
	if nd != nil {
		pol, plug, err := decisionPoints(ctx, rdb, f.dataDir, f.pluginTimeout, nil, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer pol.Close(context.WithoutCancel(ctx))
		defer plug.Close(context.WithoutCancel(ctx))
		nd.Runtime = runtimeChecker{pol, plug, log}
	}
	if nd == nil {
		ln.Close()
		return errors.New("wb node needs a runtime; --runtime none is for wb serve")
	}
	platform := &platformAddrs{guards: []*netguard.Guard{nd.Egress}, st: st, rdb: rdb, nodes: []string{*advertise, ln.Addr().String()}, log: log}
	platform.refresh(ctx)
	g, gctx := errgroup.WithContext(ctx)
	if metricsLn != nil {
		serveMetrics(gctx, g, metricsLn, f.metrics.Handler(), nd.WriteStall, log)
	}
	runNode(gctx, g, nd, ln, token, platform)
	err = g.Wait()
	nd.Close(context.Background())
	return err
}

// nodeToken answers the node's bearer token from --token-file or $WB_NODE_TOKEN. A token on
// the command line is refused: every user of the host can read a process's arguments.
func nodeToken(onCommandLine bool, file, env string) (string, error) {
	if onCommandLine {
		return "", errors.New("wb node: --token is refused: a token on the command line shows in ps and /proc to every user of this host; put it in a file readable only by wb (--token-file FILE) or in $WB_NODE_TOKEN")
	}
	if file != "" {
		return readTokenFile("--token-file", file)
	}
	if env != "" {
		return env, nil
	}
	return "", errors.New("wb node needs its token: --token-file FILE, or $WB_NODE_TOKEN")
}

// readTokenFile reads a token from the file that flag names, refusing an empty one.
func readTokenFile(flag, file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%s %s is empty; write the node token in it", flag, file)
	}
	return tok, nil
}

func hostnameOr(def string) string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return "node_" + h
	}
	return def
}

// runPoolSize is --run-pool, which defaults to --pool: runs are as fast as the node's
// sessions are warm, unless asked otherwise.
func (f *nodeFlags) runPoolSize() int {
	if f.runPool < 0 {
		return f.pool
	}
	return f.runPool
}

// warmPools answers the node's warm pools: size of each template in names (size class s),
// but desktopPool for tpl_desktop when it is not -1. A warm desktop's browser already runs.
func warmPools(names []string, size, desktopPool int) []node.Pool {
	var pools []node.Pool
	for _, name := range names {
		pool := node.Pool{Template: name, SizeClass: "s", Size: size}
		if name == guest.Template { // a small desktop is ready in seconds: its browser already runs
			pool.Warm = func(ctx context.Context, ex node.Execer) error { return guest.Start(ctx, ex) }
			if desktopPool >= 0 {
				pool.Size = desktopPool
			}
		}
		if pool.Size > 0 {
			pools = append(pools, pool)
		}
	}
	return pools
}
