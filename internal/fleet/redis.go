package fleet

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// redisServers is the Cluster's size: three primaries, each with a replica.
const redisServers = 6

// startRedis starts six cluster-enabled redis-servers with one password (primaries and
// replicas alike: a replica authenticates to its primary with it), joins them with
// redis-cli --cluster create --cluster-replicas 1, and waits until every server agrees the
// Cluster is ok with three primaries that each have a replica.
func (f *Fleet) startRedis(ctx context.Context) error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("fleet: redis-server is not installed (apt-get install -y redis-server): %w", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return fmt.Errorf("fleet: redis-cli is not installed (apt-get install -y redis-tools): %w", err)
	}
	pw := randomHex(24)
	addrs := make([]string, 0, redisServers)
	for i := range redisServers {
		addr, err := f.startRedisServer(ctx, bin, i, pw)
		if err != nil {
			return err
		}
		addrs = append(addrs, addr)
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.Env = append(os.Environ(), "REDISCLI_AUTH="+pw) // not -a: argv shows in ps
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("fleet: redis-cli --cluster create: %w\n%s", err, out)
	}
	for _, addr := range addrs {
		if err := waitClusterOK(ctx, addr, pw); err != nil {
			return err
		}
	}
	f.RedisURL = "redis://default:" + pw + "@" + strings.Join(addrs, ",")
	// Reloading the slot map every second (as wb does) follows a replica that took over.
	f.Redis = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Password: pw, DialTimeout: 2 * time.Second,
		ClusterStateReloadInterval: time.Second,
		MaintNotificationsConfig:   &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	f.opts.Logf("fleet: Redis Cluster at %s (3 primaries, 3 replicas)", strings.Join(addrs, ","))
	return nil
}

func (f *Fleet) startRedisServer(ctx context.Context, bin string, i int, pw string) (string, error) {
	dir := filepath.Join(f.opts.Dir, "redis"+strconv.Itoa(i+1))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("fleet: redis dir: %w", err)
	}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		bus, err := freePort()
		if err != nil {
			return "", err
		}
		log := filepath.Join(dir, "redis.log")
		// The password goes in through the config on stdin, not argv.
		conf := strings.Join([]string{
			"port " + strconv.Itoa(port),
			"bind 127.0.0.1",
			"cluster-enabled yes",
			"cluster-port " + strconv.Itoa(bus),
			"cluster-config-file " + filepath.Join(dir, "nodes.conf"),
			"cluster-node-timeout " + strconv.Itoa(int(f.opts.ClusterNodeTimeout/time.Millisecond)),
			"requirepass " + pw,
			"masterauth " + pw,
			`save ""`,
			"appendonly no",
			"daemonize no",
			`logfile ""`,
			"dir " + dir,
		}, "\n") + "\n"
		p, err := startRedisProc(bin, conf, log)
		if err != nil {
			return "", err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		c := redis.NewClient(&redis.Options{Addr: addr, Password: pw, DialTimeout: time.Second,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		err = waitPing(ctx, c, p)
		c.Close()
		if err == nil {
			f.redisProcs = append(f.redisProcs, p)
			return addr, nil
		}
		p.kill()
		if attempt == 2 { // a port taken between freePort and the bind: tried again, then given up
			return "", fmt.Errorf("fleet: redis-server %d: %w: %s", i+1, err, p.tail())
		}
	}
}

func startRedisProc(bin, conf, log string) (*proc, error) {
	logf, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "-")
	cmd.Stdin = strings.NewReader(conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fleet: start redis-server: %w", err)
	}
	p := &proc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func waitPing(ctx context.Context, c *redis.Client, p *proc) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("exited at start")
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no answer within 15 s: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitClusterOK waits until the server at addr says cluster_state:ok and knows three
// primaries with a replica each.
func waitClusterOK(ctx context.Context, addr, pw string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, Password: pw, DialTimeout: time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for {
		info, err := c.ClusterInfo(ctx).Result()
		nodes, err2 := c.ClusterNodes(ctx).Result()
		if err == nil && err2 == nil {
			primaries, replicas := 0, 0
			for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
				fl := strings.Fields(line)
				if len(fl) < 3 || strings.Contains(fl[2], "fail") {
					continue
				}
				switch {
				case strings.Contains(fl[2], "master"):
					primaries++
				case strings.Contains(fl[2], "slave"):
					replicas++
				}
			}
			if strings.Contains(info, "cluster_state:ok") && primaries == 3 && replicas == 3 {
				return nil
			}
			last = fmt.Sprintf("%d primaries, %d replicas:\n%s", primaries, replicas, info)
		} else {
			last = fmt.Sprint(err, err2)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("fleet: Redis Cluster at %s not ok within 30 s: %s", addr, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
