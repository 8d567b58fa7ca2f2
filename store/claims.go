package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A placement claims its session's resources on its node until the node's heartbeat shows
// them (a window of a few heartbeats). The claims are in Redis, not in a placer's memory:
// placers of several gateways placing different projects at once would otherwise each fill
// the same free room before the node reports any of it.

// claimScript drops the node's claims older than the window, and adds this one only if the
// live claims and it fit in the node's free room: its capacity less its use as its latest
// heartbeat reported them (nodeRoomKey), read here and not trusted from the caller's read,
// which may be older than a heartbeat that shows a session whose claim is gone since. Only a
// node with no room recorded (its heartbeat written before the room was) is judged by the
// caller's free room.
//
// KEYS: node's claims, node's room
// ARGV: member, vcpu, mem, free vcpu, free mem (the caller's read), now ms, window ms
// Answers {claimed (1|0), live claimed vcpu, live claimed mem} (the sums before this claim).
var claimScript = redis.NewScript(`
local now, window = tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local freeVCPU, freeMem = tonumber(ARGV[4]), tonumber(ARGV[5])
local room = redis.call('HMGET', KEYS[2], 'vcpu', 'memory_mib', 'used_vcpu', 'used_memory_mib')
if room[1] then
  freeVCPU = (tonumber(room[1]) or 0) - (tonumber(room[3]) or 0)
  freeMem = (tonumber(room[2]) or 0) - (tonumber(room[4]) or 0)
end
local vcpu, mem = 0, 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if m ~= ARGV[1] then
    local v, b = string.match(m, '|(%d+)|(%d+)$')
    vcpu, mem = vcpu + (tonumber(v) or 0), mem + (tonumber(b) or 0)
  end
end
if vcpu + tonumber(ARGV[2]) > freeVCPU or mem + tonumber(ARGV[3]) > freeMem then
  return {0, vcpu, mem}
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], window)
return {1, vcpu, mem}
`)

func claimMember(sessionID string, vcpu, mem int) string {
	return sessionID + "|" + strconv.Itoa(vcpu) + "|" + strconv.Itoa(mem)
}

// ClaimOnNode claims vcpu and mem on node for a session being placed there, if they fit,
// with the node's other live claims (those made within window before now), in the node's
// free room: its capacity less what its latest heartbeat reports in use, read in the same
// step. freeVCPU and freeMem, the room as the caller read it, count only for a node whose
// heartbeat recorded no room (written by an older wb). It answers false, claiming nothing,
// when they do not fit. Claims lapse after window, by when the node's heartbeat is to show
// the session.
func (s *Store) ClaimOnNode(ctx context.Context, nodeID, sessionID string, vcpu, mem, freeVCPU, freeMem int, now time.Time, window time.Duration) (bool, error) {
	res, err := claimScript.Run(ctx, s.rdb, []string{nodeClaimsKey(nodeID), nodeRoomKey(nodeID)},
		claimMember(sessionID, vcpu, mem), vcpu, mem, freeVCPU, freeMem, now.UnixMilli(), window.Milliseconds()).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("claim on node %s: %w", nodeID, err)
	}
	if len(res) < 1 {
		return false, fmt.Errorf("claim on node %s: script answered %v", nodeID, res)
	}
	return res[0] == 1, nil
}

// Claim is a session's claim on a node (ClaimOnNode): its id and the vCPUs and memory its
// placement claimed there.
type Claim struct {
	Session         string
	VCPU, MemoryMiB int
}

// ReleaseOnNode drops claims on node: the placer's, whose placement did not happen; the
// node's, once its heartbeat shows the session, or once the session ended there.
func (s *Store) ReleaseOnNode(ctx context.Context, nodeID string, claims ...Claim) error {
	if len(claims) == 0 {
		return nil
	}
	members := make([]any, len(claims))
	for i, c := range claims {
		members[i] = claimMember(c.Session, c.VCPU, c.MemoryMiB)
	}
	if err := s.rdb.ZRem(ctx, nodeClaimsKey(nodeID), members...).Err(); err != nil {
		return fmt.Errorf("release %d claims on node %s: %w", len(claims), nodeID, err)
	}
	return nil
}

// liveClaims queues the read of node's claims made within window before now.
func liveClaims(ctx context.Context, p redis.Pipeliner, node string, now time.Time, window time.Duration) *redis.StringSliceCmd {
	min := "(" + strconv.FormatInt(now.UnixMilli()-window.Milliseconds(), 10)
	return p.ZRangeByScore(ctx, nodeClaimsKey(node), &redis.ZRangeBy{Min: min, Max: "+inf"})
}

// claimsFrom sums the claims liveClaims read of each of nodes; a node with none is absent.
func claimsFrom(nodes []string, cmds []*redis.StringSliceCmd) map[string]NodeUse {
	out := map[string]NodeUse{}
	for i, n := range nodes {
		for _, m := range cmds[i].Val() {
			parts := strings.Split(m, "|")
			if len(parts) < 3 {
				continue
			}
			v, err1 := strconv.Atoi(parts[len(parts)-2])
			b, err2 := strconv.Atoi(parts[len(parts)-1])
			if err1 != nil || err2 != nil {
				continue
			}
			u := out[n]
			u.VCPU += v
			u.MemoryMiB += b
			out[n] = u
		}
	}
	return out
}
