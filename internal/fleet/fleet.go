package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/mtls"
	"wb/store"
)

// Options shape a fleet. The zero value of each field but Dir and Bin has a default.
type Options struct {
	// Dir holds everything the fleet writes (data dirs, Redis files, logs, the snapshot
	// store); Start creates it and Stop removes it. Keep it short: the guests' Unix socket
	// paths live below it.
	Dir string
	// Bin is the wb binary every process runs; the static wb-agent must lie beside it.
	Bin string
	// Runtime is the nodes' guest runtime: runc (default) or runsc.
	Runtime string
	// Nodes and Gateways count the `wb node`s (default 3) and gateways (default 2).
	Nodes, Gateways int
	// NodeVCPU and NodeMemoryMiB are what each node offers to guests (default 8 and 16384).
	NodeVCPU, NodeMemoryMiB int
	// Pool is each node's warm guests per template (default 0).
	Pool int
	// NodeTimeout is how long the gateways' placers wait on a silent node before its
	// sessions fail with host_failure (0: wb's default).
	NodeTimeout time.Duration
	// ClusterNodeTimeout is the Redis Cluster's cluster-node-timeout (default 2 s: a replica
	// takes over from a dead primary within a few seconds).
	ClusterNodeTimeout time.Duration
	// GatewayArgs and NodeArgs are more flags for every `wb serve` and every `wb node`.
	GatewayArgs, NodeArgs []string
	// TLS runs the fleet with mutual TLS inside it (--fleet-tls-*): Start mints a throwaway
	// CA and certificates of the node, gateway and Envoy roles for 127.0.0.1 into Dir/tls
	// (Fleet.TLSDir), the nodes serve only mutual TLS and the gateways call them over it.
	TLS bool
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
}

// Fleet is a running fleet. Its methods are safe for concurrent use.
type Fleet struct {
	opts Options
	// GatewayURLs are the gateways' base URLs; APIKey is the dev project's key on all of
	// them and AdminKey their admin key.
	GatewayURLs      []string
	APIKey, AdminKey string
	// RedisURL reaches the Cluster (it holds the password); Redis is a client of it.
	RedisURL string
	Redis    redis.UniversalClient
	// SnapshotStore is the object store URL the nodes share.
	SnapshotStore string
	// Nodes are the `wb node`s, in order of their ids node_1, node_2, ….
	Nodes []*Node
	// TLSDir, with Options.TLS, holds the fleet's CA (ca.pem) and its members' certificates
	// and keys (node, gateway and envoy .pem and -key.pem); empty without.
	TLSDir string

	redisProcs []*proc
	gateways   []*proc
	nodeToken  string

	stopOnce sync.Once
	stopErr  error

	gwMu sync.Mutex // guards gateways: RestartGateway replaces one
}

// Node is one `wb node` of the fleet.
type Node struct {
	ID, Zone, DataDir string
	proc              *proc
}

// Start starts the fleet and answers once every node has registered and every gateway
// answers. On an error it stops what it started. ctx bounds the start only.
func Start(ctx context.Context, o Options) (_ *Fleet, err error) {
	if o.Dir == "" || o.Bin == "" {
		return nil, errors.New("fleet: Options.Dir and Options.Bin are required")
	}
	if o.Runtime == "" {
		o.Runtime = "runc"
	}
	if o.Runtime != "runc" && o.Runtime != "runsc" {
		return nil, fmt.Errorf("fleet: runtime %q: want runc or runsc", o.Runtime)
	}
	o.Nodes, o.Gateways = orDefault(o.Nodes, 3), orDefault(o.Gateways, 2)
	o.NodeVCPU, o.NodeMemoryMiB = orDefault(o.NodeVCPU, 8), orDefault(o.NodeMemoryMiB, 16384)
	if o.ClusterNodeTimeout == 0 {
		o.ClusterNodeTimeout = 2 * time.Second
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return nil, fmt.Errorf("fleet: dir: %w", err)
	}
	if o.Bin, err = filepath.Abs(o.Bin); err != nil {
		return nil, fmt.Errorf("fleet: bin: %w", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(o.Bin), "wb-agent")); err != nil {
		return nil, fmt.Errorf("fleet: the guests' agent beside %s: %w (make build writes bin/wb-agent)", o.Bin, err)
	}
	// 0755, also on a dir made before (os.MkdirTemp makes 0700): a guest's unprivileged user
	// must reach its root file system and its agent below it.
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("fleet: dir: %w", err)
	}
	if err := os.Chmod(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("fleet: dir: %w", err)
	}
	f := &Fleet{opts: o, APIKey: store.NewAPIKey("wb_live_"), AdminKey: store.NewAPIKey("wb_admin_"),
		nodeToken: store.NewAPIKey("wb_node_"), SnapshotStore: "file://" + filepath.Join(o.Dir, "snapshots")}
	defer func() {
		if err != nil {
			f.Stop(context.WithoutCancel(ctx))
		}
	}()
	if o.TLS {
		if err := f.mintTLS(); err != nil {
			return nil, err
		}
	}
	if err := f.startRedis(ctx); err != nil {
		return nil, err
	}
	for i := range o.Nodes {
		if err := f.startNode(i); err != nil {
			return nil, err
		}
	}
	for i := range o.Gateways {
		if err := f.startGateway(ctx, i); err != nil {
			return nil, err
		}
	}
	for _, n := range f.Nodes {
		if err := f.waitRegistered(ctx, n); err != nil {
			return nil, err
		}
	}
	o.Logf("fleet: %d gateways, %d nodes (%s), Redis Cluster of %d", len(f.GatewayURLs), len(f.Nodes), o.Runtime, len(f.redisProcs))
	return f, nil
}

// mintTLS makes the fleet's throwaway CA and its members' certificates in Dir/tls: every
// member listens on 127.0.0.1, which the node's certificate names (the gateways check it).
func (f *Fleet) mintTLS() error {
	dir := filepath.Join(f.opts.Dir, "tls")
	local := []net.IP{net.IPv4(127, 0, 0, 1)}
	// A year: a fleet on one machine may run long, and the CA's key is not kept to renew.
	if err := mtls.Mint(dir, 365*24*time.Hour, []mtls.Member{
		{Name: "node", Roles: []string{mtls.RoleNode}, IPs: local},
		{Name: "gateway", Roles: []string{mtls.RoleGateway}, IPs: local},
		{Name: "envoy", Roles: []string{mtls.RoleEnvoy}},
	}); err != nil {
		return fmt.Errorf("fleet: TLS certificates: %w", err)
	}
	f.TLSDir = dir
	return nil
}

// tlsArgs are the --fleet-tls-* flags of a member (node or gateway), none without TLS.
func (f *Fleet) tlsArgs(member string) []string {
	if f.TLSDir == "" {
		return nil
	}
	return []string{"--fleet-tls-cert", filepath.Join(f.TLSDir, member+".pem"), "--fleet-tls-key", filepath.Join(f.TLSDir, member+"-key.pem"),
		"--fleet-tls-ca", filepath.Join(f.TLSDir, "ca.pem")}
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// env is the environment of a wb process: the secrets go there, never on the command line
// (any user of the host reads argv in /proc).
func (f *Fleet) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WB_") {
			env = append(env, kv)
		}
	}
	return append(env, "WB_REDIS_URL="+f.RedisURL, "WB_NODE_TOKEN="+f.nodeToken,
		"WB_API_KEY="+f.APIKey, "WB_ADMIN_KEY="+f.AdminKey)
}

func (f *Fleet) startNode(i int) error {
	id := "node_" + strconv.Itoa(i+1)
	n := &Node{ID: id, Zone: "local-" + string(rune('a'+i)), DataDir: filepath.Join(f.opts.Dir, "n"+strconv.Itoa(i+1))}
	args := append([]string{"node", "--addr", "127.0.0.1:0", "--id", n.ID, "--region", "local", "--zone", n.Zone,
		"--data-dir", n.DataDir, "--runtime", f.opts.Runtime, "--pool", strconv.Itoa(f.opts.Pool),
		"--vcpu", strconv.Itoa(f.opts.NodeVCPU), "--memory-mib", strconv.Itoa(f.opts.NodeMemoryMiB),
		"--snapshot-store", f.SnapshotStore}, f.tlsArgs("node")...)
	args = append(args, f.opts.NodeArgs...)
	p, err := startProc(f.opts.Bin, args, f.env(), filepath.Join(f.opts.Dir, n.ID+".log"), nil)
	if err != nil {
		return fmt.Errorf("fleet: %s: %w", id, err)
	}
	n.proc = p
	f.Nodes = append(f.Nodes, n)
	return nil
}

func (f *Fleet) startGateway(ctx context.Context, i int) error {
	p, u, err := f.runGateway(ctx, i, "127.0.0.1:0", "")
	if err != nil {
		return err
	}
	f.gwMu.Lock()
	defer f.gwMu.Unlock()
	f.gateways = append(f.gateways, p)
	f.GatewayURLs = append(f.GatewayURLs, u)
	return nil
}

func (f *Fleet) waitRegistered(ctx context.Context, n *Node) error {
	st := store.New(f.Redis)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		nodes, err := st.Nodes(ctx)
		if err == nil && slices.ContainsFunc(nodes, func(i store.NodeInfo) bool { return i.ID == n.ID }) {
			f.opts.Logf("fleet: %s registered (zone %s)", n.ID, n.Zone)
			return nil
		}
		if n.proc.exited() {
			return fmt.Errorf("fleet: %s exited at start: %s", n.ID, n.proc.tail())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("fleet: %s did not register within 3 minutes (%v): %s", n.ID, err, n.proc.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill ends the node's process with SIGKILL, as a host that dies would: its guests go on,
// orphaned, until Stop reaps them.
func (n *Node) Kill() { n.proc.kill() }

// Log answers the end of the node's log.
func (n *Node) Log() string { return n.proc.tail() }

// Logs answers the end of every process's log, for a failing test's message.
func (f *Fleet) Logs() string {
	var b strings.Builder
	for i, g := range f.gatewayProcs() {
		fmt.Fprintf(&b, "--- gateway %d:\n%s\n", i+1, g.tail())
	}
	for _, n := range f.Nodes {
		fmt.Fprintf(&b, "--- %s:\n%s\n", n.ID, n.proc.tail())
	}
	return b.String()
}

// Stop ends the gateways, the nodes (SIGTERM, then SIGKILL after a grace), destroys every
// guest any node left (a killed node's too), unmounts what they mounted, removes their
// cgroups, stops Redis and removes the fleet's directory. It answers the first error; it
// goes on past errors to stop the rest.
func (f *Fleet) Stop(ctx context.Context) error {
	f.stopOnce.Do(func() { f.stopErr = f.stop(ctx) })
	return f.stopErr
}

func (f *Fleet) stop(ctx context.Context) error {
	var errs []error
	stopAll := func(ps []*proc, grace time.Duration) {
		var wg sync.WaitGroup
		for _, p := range ps {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop(grace) }()
		}
		wg.Wait()
	}
	stopAll(f.gatewayProcs(), 30*time.Second)
	nodes := make([]*proc, 0, len(f.Nodes))
	for _, n := range f.Nodes {
		nodes = append(nodes, n.proc)
	}
	stopAll(nodes, 30*time.Second)
	for _, n := range f.Nodes {
		if err := reapGuests(ctx, f.opts.Runtime, n); err != nil {
			errs = append(errs, err)
		}
	}
	UnmountUnder(f.opts.Dir)
	if f.Redis != nil {
		_ = f.Redis.Close()
	}
	stopAll(f.redisProcs, 5*time.Second)
	if err := os.RemoveAll(f.opts.Dir); err != nil {
		errs = append(errs, fmt.Errorf("fleet: remove %s: %w", f.opts.Dir, err))
	}
	return errors.Join(errs...)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tailOf answers the end of a log file.
func tailOf(path string, n int) string {
	fh, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer fh.Close()
	if fi, err := fh.Stat(); err == nil && fi.Size() > int64(n) {
		_, _ = fh.Seek(-int64(n), io.SeekEnd)
	}
	b, _ := io.ReadAll(fh)
	return string(b)
}
