package store

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// An ended session stays readable for the store's retention, then Redis expires its hash;
// nothing in Redis announces that, so its entries in the list indexes (all, its state's, its
// end user's) would outlive it. Each session that ends joins the project's retained set
// (transitionScript), and each ending also trims up to retainedTrimBatch entries whose
// retention has lapsed (trimRetained): more than the one it adds, so a backlog drains, and
// a bounded, atomic amount of work per ending, without a sweep. List drops what it meets
// first.

// retainedTrimBatch bounds the lapsed sessions one ending drops from the indexes.
const retainedTrimBatch = 16

// dueRetained queues on p the read of up to retainedTrimBatch of the project's ended
// sessions whose retention lapsed by now.
func dueRetained(ctx context.Context, p redis.Pipeliner, project string, now time.Time) *redis.StringSliceCmd {
	return p.ZRangeByScore(ctx, ProjectKeys(project).retained(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(now.UnixMilli(), 10), Count: retainedTrimBatch})
}

// trimRetainedScript drops from the list indexes each session of ARGV[3:] (retained members)
// that is still due by ARGV[1] (ms) and whose hash has expired, and from the retained set.
// One whose hash lives on (Redis's clock behind the store's) stays for a later trim; one
// whose hash lost its TTL is not retained any more.
//
// KEYS: retained set, all, ARGV[2] terminal-state indexes, then per member its session hash
// and its end user's index (all again when it has none)
var trimRetainedScript = redis.NewScript(`
local now, ns = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  local m = ARGV[i]
  local at = 2 + ns + 2 * (i - 3)
  local score = redis.call('ZSCORE', KEYS[1], m)
  if score and tonumber(score) <= now then
    local ttl = redis.call('PTTL', KEYS[at + 1])
    if ttl == -2 then
      local id = string.match(m, '^[^/]*')
      redis.call('ZREM', KEYS[2], id)
      for j = 3, 2 + ns do redis.call('ZREM', KEYS[j], id) end
      redis.call('ZREM', KEYS[at + 2], id)
      redis.call('ZREM', KEYS[1], m)
      n = n + 1
    elseif ttl == -1 then
      redis.call('ZREM', KEYS[1], m)
    end
  end
end
return n
`)

// trimRetained drops the index entries of due, members of the project's retained set read
// by dueRetained. Best effort: what a failure leaves, the next ending (or a List) drops.
func (s *Store) trimRetained(ctx context.Context, project string, due []string, now time.Time) {
	if len(due) == 0 {
		return
	}
	k := ProjectKeys(project)
	keys := []string{k.retained(), k.all()}
	ended := 0
	for _, st := range session.States() {
		if st.Terminal() {
			keys = append(keys, k.byState(st))
			ended++
		}
	}
	args := []any{now.UnixMilli(), ended}
	for _, m := range due {
		id, endUser, _ := strings.Cut(m, "/")
		eu := k.all()
		if endUser != "" {
			eu = k.byEndUser(endUser)
		}
		keys = append(keys, k.session(id), eu)
		args = append(args, m)
	}
	_ = trimRetainedScript.Run(ctx, s.rdb, keys, args...).Err()
}
