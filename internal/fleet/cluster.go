package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisServer is one redis-server of the fleet's Cluster, as CLUSTER NODES of a live server
// sees it.
type RedisServer struct {
	Addr string // host:port
	ID   string // the Cluster's node id
	// Primary: it serves slots (or served them when it failed); else it replicates PrimaryID.
	Primary   bool
	PrimaryID string
	// Failed: the Cluster agrees it is down (flag fail; pfail is one server's suspicion).
	Failed bool
	Slots  int // how many slots it serves
}

// redisAddrs answers the Cluster's servers in start order (that of redisProcs) and its
// password, from RedisURL (redis://default:PASSWORD@h1:p1,h2:p2,…).
func (f *Fleet) redisAddrs() ([]string, string) {
	rest := strings.TrimPrefix(f.RedisURL, "redis://default:")
	pw, hosts, _ := strings.Cut(rest, "@")
	return strings.Split(hosts, ","), pw
}

func (f *Fleet) redisClient(addr, pw string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, Password: pw, DialTimeout: time.Second, ReadTimeout: time.Second,
		MaxRetries: -1, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
}

// RedisServers answers the Cluster's servers as the first live one sees them.
func (f *Fleet) RedisServers(ctx context.Context) ([]RedisServer, error) {
	addrs, pw := f.redisAddrs()
	var errs []error
	for i, addr := range addrs {
		if i < len(f.redisProcs) && f.redisProcs[i].exited() {
			continue
		}
		c := f.redisClient(addr, pw)
		out, err := c.ClusterNodes(ctx).Result()
		c.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("fleet: CLUSTER NODES of %s: %w", addr, err))
			continue
		}
		return parseClusterNodes(out), nil
	}
	return nil, fmt.Errorf("fleet: no Redis server answers: %w", errors.Join(errs...))
}

// parseClusterNodes reads CLUSTER NODES: id addr:port@bus flags primary-id ping pong epoch
// link-state slot….
func parseClusterNodes(out string) []RedisServer {
	var servers []RedisServer
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		fl := strings.Fields(line)
		if len(fl) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(fl[1], "@")
		flags := strings.Split(fl[2], ",")
		s := RedisServer{Addr: addr, ID: fl[0], Primary: slices.Contains(flags, "master"), Failed: slices.Contains(flags, "fail")}
		if fl[3] != "-" {
			s.PrimaryID = fl[3]
		}
		for _, r := range fl[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated
				continue
			}
			var lo, hi int
			if n, _ := fmt.Sscanf(r, "%d-%d", &lo, &hi); n == 2 {
				s.Slots += hi - lo + 1
			} else if n == 1 {
				s.Slots++
			}
		}
		servers = append(servers, s)
	}
	return servers
}

// PrimaryFor answers the address of the primary serving key's slot, as the first live
// server sees it.
func (f *Fleet) PrimaryFor(ctx context.Context, key string) (string, error) {
	addrs, pw := f.redisAddrs()
	var errs []error
	for i, addr := range addrs {
		if i < len(f.redisProcs) && f.redisProcs[i].exited() {
			continue
		}
		c := f.redisClient(addr, pw)
		owner, err := slotOwner(ctx, c, key)
		c.Close()
		if err == nil {
			return owner, nil
		}
		errs = append(errs, fmt.Errorf("fleet: %s: %w", addr, err))
	}
	return "", fmt.Errorf("fleet: no Redis server names the primary of %s: %w", key, errors.Join(errs...))
}

// slotOwner answers the address of the primary c says serves key's slot ("" for none).
func slotOwner(ctx context.Context, c *redis.Client, key string) (string, error) {
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return "", err
	}
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 {
			return s.Nodes[0].Addr, nil
		}
	}
	return "", nil
}

// KillRedis ends the redis-server at addr with SIGKILL, as a host that dies would: its
// replica takes over after the Cluster's node timeout (Options.ClusterNodeTimeout).
func (f *Fleet) KillRedis(addr string) error {
	addrs, _ := f.redisAddrs()
	i := slices.Index(addrs, addr)
	if i < 0 || i >= len(f.redisProcs) {
		return fmt.Errorf("fleet: no redis-server of the fleet at %s", addr)
	}
	f.redisProcs[i].kill()
	return nil
}

// WaitFailover waits until every live server says cluster_state:ok, counts the dead one as
// failed, and serves key's slot from another primary (its replica, promoted). It answers
// that primary's address.
func (f *Fleet) WaitFailover(ctx context.Context, dead, key string) (string, error) {
	addrs, pw := f.redisAddrs()
	var last string
	for {
		ok, owner := true, ""
		for i, addr := range addrs {
			if addr == dead || (i < len(f.redisProcs) && f.redisProcs[i].exited()) {
				continue
			}
			c := f.redisClient(addr, pw)
			info, err := c.ClusterInfo(ctx).Result()
			var nodes string
			if err == nil {
				nodes, err = c.ClusterNodes(ctx).Result()
			}
			if err == nil {
				owner, err = slotOwner(ctx, c, key)
			}
			c.Close()
			if err != nil {
				ok, last = false, fmt.Sprintf("%s: %v", addr, err)
				break
			}
			if !strings.Contains(info, "cluster_state:ok") {
				ok, last = false, addr+" says the cluster is not ok"
				break
			}
			deadSeen := false
			for _, s := range parseClusterNodes(nodes) {
				if s.Addr == dead {
					deadSeen = s.Failed
				}
			}
			if !deadSeen {
				ok, last = false, addr+" does not count "+dead+" as failed yet"
				break
			}
			if owner == "" || owner == dead {
				ok, last = false, fmt.Sprintf("%s: the slot of %s is served by %q", addr, key, owner)
				break
			}
		}
		if ok {
			return owner, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("fleet: no failover from %s: %s: %w", dead, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
