//go:build linux

package main

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"wb/internal/redisproc"
)

// openRedis connects to rawURL, or, when it is empty, starts the embedded Redis: a real
// redis-server of this process's own (internal/redisproc), reachable only through a Unix
// socket in embedDir, with a password made at random for this start, so nothing else on the
// machine (a guest that found a way out, another user) can read or write the platform's
// state. caFile, when set, is the PEM bundle that verifies a rediss:// server (otherwise the
// system roots do).
func openRedis(ctx context.Context, rawURL, caFile, embedDir string) (redis.UniversalClient, func(), error) {
	if rawURL == "" {
		srv, err := redisproc.Start(ctx, embedDir)
		if err != nil {
			return nil, nil, fmt.Errorf("embedded redis: %w", err)
		}
		rdb := redis.NewClient(srv.Options())
		return rdb, func() { rdb.Close(); srv.Close() }, nil
	}
	rdb, err := dialRedis(rawURL, caFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--redis %s: %w", redisLabel(rawURL), err)
	}
	return rdb, func() { rdb.Close() }, nil
}
