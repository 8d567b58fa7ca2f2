package quota

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/store"
)

// tokenBucket refills rate tokens per second up to burst, and takes one if it can.
// KEYS: bucket hash. ARGV: rate per s, burst, now ms. Answers {allowed, retry_after_ms}.
var tokenBucket = redis.NewScript(`
local rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if not tokens then tokens, ts = burst, now end
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate / 1000) end
local allowed, wait = 0, 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', string.format('%.0f', math.max(now, ts)))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {allowed, wait}
`)

// RateLimiter is a token bucket per project, kept in Redis so every gateway replica shares it.
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
	res, err := tokenBucket.Run(ctx, l.rdb, []string{store.ProjectKeys(project).RateBucket()}, rate, max(burst, 1), l.now().UnixMilli()).Int64Slice()
	if err != nil {
		return false, 0, fmt.Errorf("rate limit %s: %w", project, err)
	}
	return res[0] == 1, time.Duration(res[1]) * time.Millisecond, nil
}
