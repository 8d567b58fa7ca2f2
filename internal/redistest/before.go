package redistest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// BeforeOnce adds to rdb a hook that runs do once, before the first command that match
// accepts (pipelines pass untouched); an error from do fails that command, as if Redis had
// answered it. For a test that puts something between two of a client's calls.
func BeforeOnce(rdb redis.UniversalClient, match func(redis.Cmder) bool, do func() error) {
	h := &beforeOnce{match: match, do: do}
	h.armed.Store(true)
	rdb.AddHook(h)
}

type beforeOnce struct {
	armed atomic.Bool
	match func(redis.Cmder) bool
	do    func() error
}

func (h *beforeOnce) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *beforeOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *beforeOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) && h.armed.CompareAndSwap(true, false) {
			if err := h.do(); err != nil {
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}
