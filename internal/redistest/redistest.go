package redistest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"wb/internal/redisconn"
)

const (
	readyTimeout   = 10 * time.Second // per start attempt
	stopTimeout    = 5 * time.Second  // SIGTERM grace before SIGKILL
	clusterTimeout = 20 * time.Second // slot map convergence
	startAttempts  = 3                // port-collision retries
	installHint    = "install redis-server: apt-get install -y redis-server"
)

// Proc is a real redis-server process bound to 127.0.0.1 with its data dir
// in t.TempDir(). It keeps its port across Stop/Start. Start and Stop must be
// called from the test goroutine (they may call t.Fatal).
type Proc struct {
	t       testing.TB
	bin     string
	dir     string
	cluster bool
	durable bool // keep an append-only file across Stop/Start

	mu      sync.Mutex
	port    int           // 0 until first successful start
	busPort int           // cluster bus port (cluster nodes only)
	cmd     *exec.Cmd     // nil when stopped
	done    chan struct{} // closed when cmd has been reaped
}

// StartProc starts a real redis-server (no persistence) on a free loopback
// port and stops it in t.Cleanup.
func StartProc(t testing.TB) *Proc {
	t.Helper()
	return startProc(t, false)
}

// StartDurableProc starts a real redis-server whose data survives Stop and Start: an
// append-only file (for tests of Redis outages). Not fsynced on every write: Stop's SIGTERM
// makes Redis write and fsync the file as it shuts down, and no test crashes the machine. An
// fsync on every write made each write wait on a loaded host's disk (a cold run's node, back
// after an outage, replayed nothing in 25 s).
func StartDurableProc(t testing.TB) *Proc {
	t.Helper()
	return startProcWith(t, false, true)
}

func startProc(t testing.TB, cluster bool) *Proc {
	t.Helper()
	return startProcWith(t, cluster, false)
}

func startProcWith(t testing.TB, cluster, durable bool) *Proc {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: redis-server not found on PATH (%v); %s", err, installHint)
	}
	p := &Proc{t: t, bin: bin, dir: t.TempDir(), cluster: cluster, durable: durable}
	t.Cleanup(p.Stop)
	p.Start()
	return p
}

// Addr returns "127.0.0.1:PORT".
func (p *Proc) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
}

// Start (re)starts the server. The first start picks free ports, retrying on
// bind failures; later starts reuse the same port. No-op if already running.
func (p *Proc) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return
	}
	fixed := p.port != 0
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		if !fixed {
			p.port, p.busPort = freePort(p.t), 0
			if p.cluster {
				p.busPort = freePort(p.t)
			}
		}
		retry, err := p.startOnce()
		if err == nil {
			return
		}
		lastErr = err
		if !retry {
			break
		}
		if fixed {
			time.Sleep(200 * time.Millisecond) // old socket may linger briefly
		}
	}
	if !fixed {
		p.port = 0
	}
	p.t.Fatalf("redistest: %v", lastErr)
}

// startOnce launches the process and waits for PONG. retry reports whether
// the failure looks like a port collision.
func (p *Proc) startOnce() (retry bool, err error) {
	logPath := filepath.Join(p.dir, "redis.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return false, err
	}
	defer logf.Close() // the child keeps its own descriptor
	off, _ := logf.Seek(0, io.SeekEnd)

	args := []string{
		"--port", strconv.Itoa(p.port),
		"--bind", "127.0.0.1",
		"--dir", p.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", "",
	}
	if p.durable {
		args = append(args, "--appendonly", "yes", "--appendfsync", "no")
	}
	if p.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(p.busPort),
			"--cluster-config-file", filepath.Join(p.dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
		)
	}
	cmd := exec.Command(p.bin, args...)
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	output := func() string {
		b, _ := os.ReadFile(logPath)
		if int64(len(b)) >= off {
			b = b[off:]
		}
		return strings.TrimSpace(string(b))
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-done:
			out := output()
			bindErr := strings.Contains(out, "Address already in use") ||
				strings.Contains(out, "Could not create server TCP listening socket")
			return bindErr, fmt.Errorf("redis-server on %s exited early (%s):\n%s", addr, cmd.ProcessState, out)
		default:
		}
		if ping(addr) == nil {
			p.cmd, p.done = cmd, done
			return false, nil
		}
		if time.Now().After(deadline) {
			kill(cmd, done)
			return false, fmt.Errorf("redis-server on %s not ready after %v:\n%s", addr, readyTimeout, output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop terminates the server (SIGTERM, then SIGKILL after 5 s) and waits for
// it to exit. No-op if not running.
// Pid answers the server's process id (0 while stopped), for tests that measure its CPU.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *Proc) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	kill(p.cmd, p.done)
	p.cmd, p.done = nil, nil
}

func kill(cmd *exec.Cmd, done <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return
	case <-time.After(stopTimeout):
	}
	_ = cmd.Process.Kill()
	<-done // SIGKILL cannot be ignored; Wait returns promptly
}

// ping sends an inline PING over a raw connection (no client pool, no goroutines).
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("unexpected PING reply %q", line)
	}
	return nil
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: pick free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newClient returns a client for a single node; closed in t.Cleanup.
func newClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(nodeOptions(addr))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func nodeOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                     addr,
		DialTimeout:              2 * time.Second,
		Dialer:                   redisconn.Dialer(2 * time.Second),
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// ServerAddr starts a real redis-server (stopped in t.Cleanup) and returns
// its "127.0.0.1:PORT".
func ServerAddr(t testing.TB) string {
	t.Helper()
	return StartProc(t).Addr()
}

// Server starts a real redis-server and returns a client for it. Both are
// shut down in t.Cleanup.
func Server(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, ServerAddr(t))
}

// Mini starts an in-process miniredis and returns a client for it plus the
// server handle (for FastForward, SetTime, ...). Both close in t.Cleanup.
func Mini(t testing.TB) (*redis.Client, *miniredis.Miniredis) {
	t.Helper()
	m := miniredis.RunT(t)
	return newClient(t, m.Addr()), m
}

// clusterRanges are the slot ranges assigned to the three masters.
var clusterRanges = [3][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// Cluster starts a 3-master Redis Cluster (no replicas) on loopback ports,
// waits until every node reports cluster_state:ok and the same slot map, and
// returns a cluster client. Everything is shut down in t.Cleanup.
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	procs := make([]*Proc, len(clusterRanges))
	nodes := make([]*redis.Client, len(clusterRanges))
	addrs := make([]string, len(clusterRanges))
	for i := range procs {
		procs[i] = startProc(t, true)
		addrs[i] = procs[i].Addr()
		nodes[i] = redis.NewClient(nodeOptions(addrs[i]))
	}
	defer func() {
		for _, n := range nodes {
			_ = n.Close()
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	for i, n := range nodes {
		r := clusterRanges[i]
		if err := n.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", r[0], r[1]).Err(); err != nil {
			t.Fatalf("redistest: CLUSTER ADDSLOTSRANGE %d %d on %s: %v", r[0], r[1], addrs[i], err)
		}
	}
	for i := 1; i < len(procs); i++ {
		// The bus port is explicit: it is not the default port+10000.
		if err := nodes[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", procs[i].port, procs[i].busPort).Err(); err != nil {
			t.Fatalf("redistest: CLUSTER MEET %s from %s: %v", addrs[i], addrs[0], err)
		}
	}

	want := make(map[[2]int]string, len(clusterRanges))
	for i, r := range clusterRanges {
		want[r] = addrs[i]
	}
	var lastErr error
	for {
		if lastErr = clusterConverged(ctx, nodes, want); lastErr == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: cluster %v not ready after %v: %v", addrs, clusterTimeout, lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}

	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                    addrs,
		DialTimeout:              2 * time.Second,
		Dialer:                   redisconn.Dialer(2 * time.Second),
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// clusterConverged reports nil once every node is in state ok and its
// CLUSTER SLOTS equals want (slot range -> master addr).
func clusterConverged(ctx context.Context, nodes []*redis.Client, want map[[2]int]string) error {
	for _, n := range nodes {
		info, err := n.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", n.Options().Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state not ok:\n%s", n.Options().Addr, info)
		}
		slots, err := n.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER SLOTS: %w", n.Options().Addr, err)
		}
		got := make(map[[2]int]string, len(slots))
		for _, s := range slots {
			if len(s.Nodes) == 0 {
				continue
			}
			got[[2]int{s.Start, s.End}] = s.Nodes[0].Addr
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("%s: slot map %v, want %v", n.Options().Addr, got, want)
		}
	}
	return nil
}

// Backend is a named constructor for running a suite against several
// Redis implementations.
type Backend struct {
	Name string
	New  func(t testing.TB) redis.UniversalClient
}

// Backends returns the "redis", "miniredis" and "cluster" backends.
func Backends() []Backend {
	return []Backend{
		{Name: "redis", New: func(t testing.TB) redis.UniversalClient { return Server(t) }},
		{Name: "miniredis", New: func(t testing.TB) redis.UniversalClient { c, _ := Mini(t); return c }},
		{Name: "cluster", New: func(t testing.TB) redis.UniversalClient { return Cluster(t) }},
	}
}
