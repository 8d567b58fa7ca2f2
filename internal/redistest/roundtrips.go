package redistest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// RoundTrips counts a client's calls to Redis: one per command, one per pipeline.
type RoundTrips struct{ n atomic.Int64 }

// CountRoundTrips counts rdb's calls from now on.
func CountRoundTrips(rdb redis.UniversalClient) *RoundTrips {
	rt := &RoundTrips{}
	rdb.AddHook(rt)
	return rt
}

// Load answers the calls counted so far.
func (r *RoundTrips) Load() int64 { return r.n.Load() }

func (r *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmd)
	}
}

func (r *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmds)
	}
}
