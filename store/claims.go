package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
// node with no room recorded (its heartbeat written before the room was, or by a wb that
// writes none, whose last room lapsed) is judged by the caller's read. A session's claims
// count once, whichever placers made them: two placing the same session (one stalled past
// its project lock) hold one session's room.
//
// With a share (1–100 %), the project's sessions on the node, as the room reports them, with
// the project's live claims and this one, stay within that share of the node's capacity:
// checked here for the same reason, since two placers of one project (one stalled past its
// project lock) each checked it against their own read. A room without the projects field
// (written by an older wb) leaves the share to the caller, which checked it against its read.
//
// KEYS: node's claims, node's room
// ARGV: member, session, vcpu, mem, capacity vcpu, capacity mem, used vcpu, used mem (the
// caller's read), now ms, window ms, project, share pct (0: none)
// Answers {claimed (1|0), live claimed vcpu, live claimed mem} (the sums of the other
// sessions' claims).
var claimScript = redis.NewScript(`
local now, window = tonumber(ARGV[9]), tonumber(ARGV[10])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local capVCPU, capMem = tonumber(ARGV[5]), tonumber(ARGV[6])
local usedVCPU, usedMem = tonumber(ARGV[7]), tonumber(ARGV[8])
local project, pct = ARGV[11], tonumber(ARGV[12]) or 0
local room = redis.call('HMGET', KEYS[2], 'vcpu', 'memory_mib', 'used_vcpu', 'used_memory_mib', 'projects')
local projVCPU, projMem
if room[1] then
  capVCPU, capMem = tonumber(room[1]) or 0, tonumber(room[2]) or 0
  usedVCPU, usedMem = tonumber(room[3]) or 0, tonumber(room[4]) or 0
  if room[5] then
    projVCPU, projMem = 0, 0
    local at = string.find(room[5], ';' .. project .. ':', 1, true)
    if at then
      local v, b = string.match(room[5], '^(%d+):(%d+);', at + #project + 2)
      projVCPU, projMem = tonumber(v) or 0, tonumber(b) or 0
    end
  end
end
local vcpu, mem, pvcpu, pmem, seen = 0, 0, 0, 0, {[ARGV[2]] = true}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local sess = string.match(m, '^[^|]*')
  if not seen[sess] then
    seen[sess] = true
    local v, b = string.match(m, '|(%d+)|(%d+)$')
    v, b = tonumber(v) or 0, tonumber(b) or 0
    vcpu, mem = vcpu + v, mem + b
    if string.match(m, '^[^|]*|[^|]*|([^|]*)|%d+|%d+$') == project then
      pvcpu, pmem = pvcpu + v, pmem + b
    end
  end
end
local needVCPU, needMem = tonumber(ARGV[3]), tonumber(ARGV[4])
if vcpu + needVCPU > capVCPU - usedVCPU or mem + needMem > capMem - usedMem then
  return {0, vcpu, mem}
end
if pct > 0 and projVCPU and ((projVCPU + pvcpu + needVCPU) * 100 > capVCPU * pct or (projMem + pmem + needMem) * 100 > capMem * pct) then
  return {0, vcpu, mem}
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], window)
return {1, vcpu, mem}
`)

// claimMember is a claim's member of its node's claims: session|token|project|vcpu|mem (one
// of an older wb has no project; the sums read the last two fields).
func claimMember(c Claim) string {
	return c.Session + "|" + c.Token + "|" + c.Project + "|" + strconv.Itoa(c.VCPU) + "|" + strconv.Itoa(c.MemoryMiB)
}

// ClaimAsk is a placement's claim on a node (ClaimOnNode): the session's, and the node as
// the caller read it.
type ClaimAsk struct {
	// Node is the node as the caller read it. Its capacity and use count only for a node
	// whose heartbeat recorded no room (written by an older wb, or lapsed).
	Node             NodeInfo
	Session, Project string
	VCPU, MemoryMiB  int
	// SharePct is the project's share of any one node (Plan.NodeSharePct), 0 for none: the
	// project's sessions on the node, as its heartbeat reports them, with the project's live
	// claims there and this one, stay within it.
	SharePct int
}

// ClaimOnNode claims a.VCPU and a.MemoryMiB on a.Node for a session being placed there, if
// they fit, with the node's other live claims (those made within window before now), in the
// node's free room: its capacity less what its latest heartbeat reports in use, read in the
// same step; and if the project stays within a.SharePct of the node, checked in that step
// too. It answers false, claiming nothing, when they do not fit, and else the claim, which
// the caller releases (ReleaseOnNode) if its placement does not happen. Claims lapse after
// window, by when the node's heartbeat is to show the session.
func (s *Store) ClaimOnNode(ctx context.Context, a ClaimAsk, now time.Time, window time.Duration) (Claim, bool, error) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	c := Claim{Session: a.Session, Project: a.Project, VCPU: a.VCPU, MemoryMiB: a.MemoryMiB, Token: hex.EncodeToString(b)}
	n := a.Node
	res, err := claimScript.Run(ctx, s.rdb, []string{nodeClaimsKey(n.ID), nodeRoomKey(n.ID)},
		claimMember(c), a.Session, a.VCPU, a.MemoryMiB, n.VCPU, n.MemoryMiB, n.UsedVCPU, n.UsedMemoryMiB,
		now.UnixMilli(), window.Milliseconds(), a.Project, a.SharePct).Int64Slice()
	if err != nil {
		return Claim{}, false, fmt.Errorf("claim on node %s: %w", n.ID, err)
	}
	if len(res) < 1 {
		return Claim{}, false, fmt.Errorf("claim on node %s: script answered %v", n.ID, res)
	}
	if res[0] != 1 {
		return Claim{}, false, nil
	}
	return c, true, nil
}

// Claim is a session's claim on a node (ClaimOnNode): its id and the vCPUs and memory its
// placement claimed there.
type Claim struct {
	Session, Project string
	VCPU, MemoryMiB  int
	// Token names the one claim ClaimOnNode made. A release with it drops that claim only,
	// and never another placer's of the same session; one without it (the node's, which
	// knows the session only) drops every claim of the session.
	Token string
}

// releaseClaimsScript drops some of a node's claims by their member, and every claim of some
// sessions.
//
// KEYS: node's claims
// ARGV: the number n of members, n members, then sessions
// Answers how many claims it dropped.
var releaseClaimsScript = redis.NewScript(`
local n, dropped = tonumber(ARGV[1]), 0
for i = 2, n + 1 do dropped = dropped + redis.call('ZREM', KEYS[1], ARGV[i]) end
if #ARGV > n + 1 then
  local drop = {}
  for i = n + 2, #ARGV do drop[ARGV[i]] = true end
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if drop[string.match(m, '^[^|]*')] then dropped = dropped + redis.call('ZREM', KEYS[1], m) end
  end
end
return dropped
`)

// ReleaseOnNode drops claims on node: the placer's, whose placement did not happen (the
// claim ClaimOnNode answered: that one only); the node's, once its heartbeat shows the
// session, or once the session ended there (no token: every claim of the session).
func (s *Store) ReleaseOnNode(ctx context.Context, nodeID string, claims ...Claim) error {
	if len(claims) == 0 {
		return nil
	}
	var members, sessions []any
	for _, c := range claims {
		if c.Token != "" {
			members = append(members, claimMember(c))
		} else {
			sessions = append(sessions, c.Session)
		}
	}
	args := append(append([]any{len(members)}, members...), sessions...)
	if err := releaseClaimsScript.Run(ctx, s.rdb, []string{nodeClaimsKey(nodeID)}, args...).Err(); err != nil {
		return fmt.Errorf("release %d claims on node %s: %w", len(claims), nodeID, err)
	}
	return nil
}

// liveClaims queues the read of node's claims made within window before now.
func liveClaims(ctx context.Context, p redis.Pipeliner, node string, now time.Time, window time.Duration) *redis.StringSliceCmd {
	min := "(" + strconv.FormatInt(now.UnixMilli()-window.Milliseconds(), 10)
	return p.ZRangeByScore(ctx, nodeClaimsKey(node), &redis.ZRangeBy{Min: min, Max: "+inf"})
}

// claimsFrom sums the claims liveClaims read of each of nodes, each session's once (as the
// claim script does); a node with none is absent.
func claimsFrom(nodes []string, cmds []*redis.StringSliceCmd) map[string]NodeUse {
	out := map[string]NodeUse{}
	for i, n := range nodes {
		seen := map[string]bool{}
		for _, m := range cmds[i].Val() {
			parts := strings.Split(m, "|")
			if len(parts) < 3 || seen[parts[0]] {
				continue
			}
			v, err1 := strconv.Atoi(parts[len(parts)-2])
			b, err2 := strconv.Atoi(parts[len(parts)-1])
			if err1 != nil || err2 != nil {
				continue
			}
			seen[parts[0]] = true
			u := out[n]
			u.VCPU += v
			u.MemoryMiB += b
			out[n] = u
		}
	}
	return out
}
