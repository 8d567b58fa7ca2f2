package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// TailSignals reads the signals of w appended after the entry after, waiting up to wait for
// one, without a consumer group: for a reader that only needs to hear that a project's state
// changed (a cache to drop), not to claim the work, so it leaves every signal to its worker.
// after "" starts from now (the newest entry). It answers at most count signals and the id
// to pass as after next time (after itself when nothing came).
//
// A tail can miss a signal: one that its worker acknowledged and deleted (AckSignals) between
// two reads of the tail. A reader must therefore bound how long it trusts what it cached.
func (s *Store) TailSignals(ctx context.Context, w Work, after string, wait time.Duration, count int) ([]Signal, string, error) {
	key := signalKey(w)
	if after == "" {
		last, err := s.rdb.XRevRangeN(ctx, key, "+", "-", 1).Result()
		if err != nil {
			return nil, "", fmt.Errorf("read the newest %s signal: %w", w, err)
		}
		after = "0-0"
		if len(last) > 0 {
			after = last[0].ID
		}
	}
	res, err := s.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{key, after}, Count: int64(count), Block: blockArg(wait)}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, after, nil
	}
	if err != nil {
		return nil, after, fmt.Errorf("tail the %s signals: %w", w, err)
	}
	var out []Signal
	for _, st := range res {
		out = append(out, toSignals(st.Messages)...)
	}
	if len(out) > 0 {
		after = out[len(out)-1].ID
	}
	return out, after, nil
}
