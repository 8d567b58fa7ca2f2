package quota

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/store"
)

// DefaultReplayWindow is how long after a session's last settled record its replays are still
// recognised (SettlerOptions.ReplayWindow): as long as an ended session is kept (the store's
// retention). A replay is a record settled again: one a settler applied and died before
// acknowledging (settled again at the project's next round, in seconds), or one a node wrote
// twice (its journal replays what Redis may have taken, as soon as Redis answers again).
const DefaultReplayWindow = 7 * 24 * time.Hour

// spendHoursKept is how long the spend hash keeps its hourly fields. No code reads them: GET
// /v1/usage sums the hourly report buckets (UsageHour, with a TTL of their own), and the caps
// and GET /v1/limits read the month's fields. Two days keep them for an operator's look at a
// recent incident, while the hash stops growing by a field an hour per end user.
const spendHoursKept = 48 * time.Hour

// spendDaysKept is how long the spend hash keeps its daily fields. No code reads them either
// (see spendHoursKept); they are kept as long as one usage report can span (MaxReportHours),
// for an operator comparing a report with them, while the hash stops growing by a field a
// day per end user.
const spendDaysKept = MaxReportHours * time.Hour

// spendMonthsKept is how long after its month's end the spend hash keeps a monthly field.
// The caps and GET /v1/limits read the current month's only; GET /v1/usage reports any hour
// whose bucket is still kept (UsageHour: 400 days), and a month's field is kept as long as
// the last of its hours can be reported, so that a report's figures can be compared with the
// month's for every month a report can reach. The hash stops growing by a field a month per
// end user.
const spendMonthsKept = 400 * 24 * time.Hour

// indexedVersion is the value of the project's Indexed flag once its seq entries and its
// hourly and daily spend fields written before their indexes existed are indexed: a flag
// of before (1, without the daily fields) has the project indexed again.
const indexedVersion = "2"

// pruneBatch bounds the entries one prune script drops from each index.
const pruneBatch = 1000

// pruneScript drops, from the seq hash, the sessions last settled before the seq cutoff, and
// from the spend hash the hourly fields of hours before the hours cutoff, the daily fields
// of days before the days cutoff and the monthly fields of months ended before the months
// cutoff, a batch of each (the indexes name them: settleScript). It answers how many of each
// it dropped, and whether the project's older entries are indexed (indexBefore: both flags),
// or there are none.
//
// KEYS: seq hash, seq index, spend hash, hours index, indexed flag, days index, months
// index, months' indexed flag. ARGV: seq cutoff ms, hours cutoff ms, batch, days cutoff ms,
// indexed flag's version, months cutoff ms.
var pruneScript = redis.NewScript(`
local out = {}
for i, k in ipairs({{KEYS[1], KEYS[2], ARGV[1]}, {KEYS[3], KEYS[4], ARGV[2]}, {KEYS[3], KEYS[6], ARGV[4]}, {KEYS[3], KEYS[7], ARGV[6]}}) do
  local names = redis.call('ZRANGEBYSCORE', k[2], '-inf', '(' .. k[3], 'LIMIT', 0, ARGV[3])
  if #names > 0 then
    redis.call('HDEL', k[1], unpack(names))
    redis.call('ZREM', k[2], unpack(names))
  end
  out[i] = #names
end
if (redis.call('GET', KEYS[5]) == ARGV[5] and redis.call('GET', KEYS[8]) == '1') or redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then out[5] = 1 else out[5] = 0 end
return out
`)

// prune drops what no reader needs any more from the projects' seq hashes (sessions settled
// longer than the replay window ago) and spend hashes (hourly fields older than
// spendHoursKept, daily ones older than spendDaysKept, monthly ones of months ended longer
// than spendMonthsKept ago): a round trip per sweepBatch projects, and another for a project
// with more than a batch to drop. The sweep calls it only for projects whose streams it found with
// nothing unsettled: a record there could be a replay of one settled long ago.
func (s *Settler) prune(ctx context.Context, projects []string, now time.Time) error {
	const sweepBatch = 500
	seqCutoff, hoursCutoff := now.Add(-s.replayWindow).UnixMilli(), now.Add(-spendHoursKept).UnixMilli()
	daysCutoff, monthsCutoff := now.Add(-spendDaysKept).UnixMilli(), now.Add(-spendMonthsKept).UnixMilli()
	loaded := false
	for len(projects) > 0 {
		part := projects[:min(sweepBatch, len(projects))]
		projects = projects[len(part):]
		cmds := make([]*redis.Cmd, len(part))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, project := range part {
				k := store.ProjectKeys(project)
				cmds[i] = pruneScript.EvalSha(ctx, p, []string{k.UsageSeq(), k.UsageSeqAt(), k.Spend(), k.SpendHours(), k.Indexed(), k.SpendDays(),
					k.SpendMonths(), k.IndexedMonths()}, seqCutoff, hoursCutoff, pruneBatch, daysCutoff, indexedVersion, monthsCutoff)
			}
			return nil
		})
		if isNoScript(err) && !loaded {
			// First use on this server: load the script and redo the batch.
			if err := pruneScript.Load(ctx, s.rdb).Err(); err != nil {
				return fmt.Errorf("prune: load script: %w", err)
			}
			loaded = true
			projects = slices.Concat(part, projects)
			continue
		}
		if err != nil {
			return fmt.Errorf("prune: %w", err)
		}
		for i, c := range cmds {
			n, err := c.Int64Slice()
			if err != nil {
				return fmt.Errorf("prune %s: %w", part[i], err)
			}
			if len(n) != 5 {
				return fmt.Errorf("prune %s: answered %v", part[i], n)
			}
			if n[4] == 0 {
				if err := s.indexBefore(ctx, part[i], now); err != nil {
					return err
				}
			}
			if n[0] == pruneBatch || n[1] == pruneBatch || n[2] == pruneBatch || n[3] == pruneBatch || n[4] == 0 {
				projects = append(projects, part[i]) // more to drop: again, in a later batch
			}
		}
	}
	return nil
}

// indexBefore indexes, once, a project's seq entries and hourly, daily and monthly spend
// fields written before their indexes existed, so that they are pruned too: the seq entries
// as settled now (when they were is not known), the hourly fields by the hour they name, the
// daily ones by the day, the monthly ones by the month's end. HSCAN, a batch at a time, then
// the project's flags.
func (s *Settler) indexBefore(ctx context.Context, project string, now time.Time) error {
	k := store.ProjectKeys(project)
	for _, h := range []struct {
		hash, index string
		score       func(field string) (int64, bool)
	}{
		{k.UsageSeq(), k.UsageSeqAt(), func(string) (int64, bool) { return now.UnixMilli(), true }},
		{k.Spend(), k.SpendHours(), hourOfSpendField},
		{k.Spend(), k.SpendDays(), dayOfSpendField},
		{k.Spend(), k.SpendMonths(), monthEndOfSpendField},
	} {
		var cursor uint64
		for {
			kv, next, err := s.rdb.HScan(ctx, h.hash, cursor, "", pruneBatch).Result()
			if err != nil {
				return fmt.Errorf("index %s: %w", h.hash, err)
			}
			var zs []redis.Z
			for i := 0; i+1 < len(kv); i += 2 {
				if ms, ok := h.score(kv[i]); ok {
					zs = append(zs, redis.Z{Score: float64(ms), Member: kv[i]})
				}
			}
			if len(zs) > 0 {
				if err := s.rdb.ZAddNX(ctx, h.index, zs...).Err(); err != nil {
					return fmt.Errorf("index %s: %w", h.hash, err)
				}
			}
			if next == 0 {
				break
			}
			cursor = next
		}
	}
	if err := s.rdb.Set(ctx, k.Indexed(), indexedVersion, 0).Err(); err != nil {
		return fmt.Errorf("index %s: %w", project, err)
	}
	if err := s.rdb.Set(ctx, k.IndexedMonths(), "1", 0).Err(); err != nil {
		return fmt.Errorf("index %s: %w", project, err)
	}
	return nil
}

// hourOfSpendField answers the start (ms) of the hour an hourly spend field names: h:HOUR or
// eu:END_USER:h:HOUR, HOUR as YYYYMMDDHH.
func hourOfSpendField(f string) (int64, bool) { return timeOfSpendField(f, "h", "2006010215") }

// dayOfSpendField answers the start (ms) of the day a daily spend field names: d:DAY or
// eu:END_USER:d:DAY, DAY as YYYYMMDD.
func dayOfSpendField(f string) (int64, bool) { return timeOfSpendField(f, "d", "20060102") }

// monthEndOfSpendField answers the end (ms) of the month a monthly spend field names: m:MONTH
// or eu:END_USER:m:MONTH, MONTH as YYYYMM.
func monthEndOfSpendField(f string) (int64, bool) {
	ms, ok := timeOfSpendField(f, "m", "200601")
	if !ok {
		return 0, false
	}
	return monthEnd(time.UnixMilli(ms)).UnixMilli(), true
}

// timeOfSpendField answers the time (ms) a spend field of kind (h, d) names, in layout: KIND:T
// or eu:END_USER:KIND:T.
func timeOfSpendField(f, kind, layout string) (int64, bool) {
	tLen, n := len(layout), len(f)
	pre, mid := kind+":", ":"+kind+":"
	ok := (n == len(pre)+tLen && strings.HasPrefix(f, pre)) ||
		(n > len("eu:")+len(mid)+tLen && strings.HasPrefix(f, "eu:") && f[n-tLen-len(mid):n-tLen] == mid)
	if !ok {
		return 0, false
	}
	t, err := time.Parse(layout, f[n-tLen:])
	if err != nil {
		return 0, false
	}
	return t.UnixMilli(), true
}
