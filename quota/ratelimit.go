package quota

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/store"
)

// RateLimiter is a token bucket per project, kept in Redis so every gateway replica shares it
// (the store's script, which creates take a token from within their admission script).
type RateLimiter struct {
	rdb redis.UniversalClient
	now func() time.Time
}

// NewRateLimiter returns a limiter over rdb.
func NewRateLimiter(rdb redis.UniversalClient) *RateLimiter {
	return &RateLimiter{rdb: rdb, now: time.Now}
}

// Allow takes one token from the project's bucket (rate per second, up to burst). When the
// bucket is empty it answers false and how long until a token is there.
func (l *RateLimiter) Allow(ctx context.Context, project string, rate, burst int) (bool, time.Duration, error) {
	if rate <= 0 {
		return false, time.Second, nil
	}
	return store.TakeToken(ctx, l.rdb, project, rate, burst, l.now())
}
