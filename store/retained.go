package store

import (
	"context"
	"fmt"
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
// by dueRetained, and answers how many it dropped. Best effort: what a failure leaves, the
// next ending, List or TrimLapsed drops.
func (s *Store) trimRetained(ctx context.Context, project string, due []string, now time.Time) (int, error) {
	if len(due) == 0 {
		return 0, nil
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
	return trimRetainedScript.Run(ctx, s.rdb, keys, args...).Int()
}

// lapsedPerProject bounds the lapsed sessions one TrimLapsed drops per project, so that a
// sweep over every project takes its turn with each; a longer backlog drains over sweeps.
const lapsedPerProject = 64 * retainedTrimBatch

// TrimLapsed drops from the list indexes the entries of the projects' ended sessions whose
// retention lapsed, up to lapsedPerProject each. Endings trim as they go, but a project whose
// sessions stopped ending (a burst, then nothing) would hold its last retention's worth of
// entries for good: a sweep over every project calls this. One round trip per sweepBatch
// projects finds the few with lapsed sessions.
func (s *Store) TrimLapsed(ctx context.Context, projects []string) error {
	now := s.now()
	max := strconv.FormatInt(now.UnixMilli(), 10)
	counts, err := s.countEach(ctx, projects, func(p redis.Pipeliner, project string) *redis.IntCmd {
		return p.ZCount(ctx, ProjectKeys(project).retained(), "-inf", max)
	})
	if err != nil {
		return fmt.Errorf("find projects with lapsed sessions: %w", err)
	}
	for i, n := range counts {
		for left := min(n, lapsedPerProject); left > 0; left -= retainedTrimBatch {
			due, err := s.rdb.ZRangeByScore(ctx, ProjectKeys(projects[i]).retained(), &redis.ZRangeBy{
				Min: "-inf", Max: max, Count: retainedTrimBatch}).Result()
			if err == nil {
				var dropped int
				dropped, err = s.trimRetained(ctx, projects[i], due, now)
				if err == nil && dropped < len(due) {
					break // the rest live on (Redis's clock behind ours) or were never due
				}
			}
			if err != nil {
				return fmt.Errorf("trim the lapsed sessions of %s: %w", projects[i], err)
			}
		}
	}
	return nil
}
