package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// AppendUsage appends one usage record (its stream fields, as quota.Record.Values answers
// them) to the project's usage stream, for quota's settler.
func (s *Store) AppendUsage(ctx context.Context, project string, fields []any) error {
	if err := s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: ProjectKeys(project).UsageStream(), Values: fields}).Err(); err != nil {
		return fmt.Errorf("append usage of %s: %w", project, err)
	}
	s.signalAfter(ctx, project, WorkUsage)
	return nil
}

// SessionUsage is settled usage to add to one session's usage to date: the sums of its usage
// records FromSeq through ToSeq.
type SessionUsage struct {
	ID             string
	FromSeq, ToSeq int64
	SessionMs      int64
	PausedMs       int64
	CPUMs          int64
	MemGiBMs       int64
	EgressBytes    int64
	CostNano       int64
}

// addUsageScript adds a run of records to a session's usage to date once: the hash keeps the
// last seq added (u_seq), so a run wholly at or below it is a replay and changes nothing, and a
// run that straddles it answers -1 (the caller adds its records one by one). A session that no
// longer exists (its retention ended) is not recreated.
//
// KEYS: session hash. ARGV: from seq, to seq, session_ms, paused_ms, cpu_ms, mem_gib_ms,
// egress bytes, cost nano.
var addUsageScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local last = tonumber(redis.call('HGET', KEYS[1], 'u_seq') or '0')
if tonumber(ARGV[2]) <= last then return 0 end
if tonumber(ARGV[1]) <= last then return -1 end
redis.call('HSET', KEYS[1], 'u_seq', ARGV[2])
local fields = {'u_ms', 'u_paused_ms', 'u_cpu', 'u_mem', 'u_egress', 'cost_nano'}
for i = 1, 6 do redis.call('HINCRBY', KEYS[1], fields[i], ARGV[i + 2]) end
return 1
`)

// AddSessionUsage adds each run of settled usage to its session's usage to date, exactly once
// however often it is called with the same runs, in one round trip. It answers the indexes
// of the runs that straddle what an earlier, interrupted call added: add their records one
// run each.
func (s *Store) AddSessionUsage(ctx context.Context, project string, runs []SessionUsage) ([]int, error) {
	return s.addSessionUsage(ctx, project, runs, false)
}

func (s *Store) addSessionUsage(ctx context.Context, project string, runs []SessionUsage, loaded bool) ([]int, error) {
	if len(runs) == 0 {
		return nil, nil
	}
	k := ProjectKeys(project)
	cmds := make([]*redis.Cmd, len(runs))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range runs {
			cmds[i] = addUsageScript.EvalSha(ctx, p, []string{k.session(r.ID)}, r.FromSeq, r.ToSeq,
				r.SessionMs, r.PausedMs, r.CPUMs, r.MemGiBMs, r.EgressBytes, r.CostNano)
		}
		return nil
	})
	if err != nil && !loaded && strings.Contains(err.Error(), "NOSCRIPT") {
		// First use on this server: load the script and redo the batch (u_seq makes the
		// redo exact).
		if err := addUsageScript.Load(ctx, s.rdb).Err(); err != nil {
			return nil, fmt.Errorf("add session usage: load script: %w", err)
		}
		return s.addSessionUsage(ctx, project, runs, true)
	}
	if err != nil {
		return nil, fmt.Errorf("add session usage of %s: %w", project, err)
	}
	var straddled []int
	for i, c := range cmds {
		if n, _ := c.Int64(); n == -1 {
			straddled = append(straddled, i)
		}
	}
	return straddled, nil
}
