package webhooks

import (
	"github.com/redis/go-redis/v9"

	"wb/store"
)

// Every script but pickScript touches the keys of one project only (one Cluster slot).

// createScript adds an endpoint unless the project already has ARGV[3]: 1 if added, 2 if
// one has its id already (it is left as it is), else 0.
// KEYS: endpoints. ARGV: id, endpoint JSON, max.
var createScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 2 end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
`)

// luaOutbox holds the Lua functions of the scripts that read an outbox's consumer groups:
// store.StreamTrimLua's (fields, trim, …) and group(stream, name), which answers the group's
// XINFO GROUPS fields (name, pending, last-delivered-id, lag, …) by name, or nil.
const luaOutbox = store.StreamTrimLua + `
local function group(stream, name)
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local f = fields(g)
    if f['name'] == name then return f end
  end
  return nil
end
`

// takeScript takes the hold on a project's outbox to read it, unless it has nothing to read.
//
// Held by another: it sets the again flag, which makes the holder read once more before it
// lets go, so that nothing written while it held the outbox waits for a later signal.
// Nothing to read (no entry pending or undelivered in the group): it trims the outbox and
// does not take the hold. No endpoint, and no entry pending: every new entry is skipped
// unread, as a read would skip it (an event goes to the endpoints there are when it is
// read, so never to one made later), and the hold is not taken: with no other group, by
// deleting the outbox, which nobody needs (measured: a third of the Redis CPU of trimming it
// entry by entry), its group made anew by the next take; else by moving the group past the newest
// entry (XGROUP SETID is not in miniredis: the group, with no pending entry, is made anew at
// "$") and trimming the outbox. Taken: every entry that any other consumer
// left pending (a dispatcher that died holding it, or one of an older version, each under
// its own name) is claimed by consumer and those consumers are removed, so that one read
// from "0" finds them, in stream order, before the new ones.
//
// KEYS: owner, again, outbox, endpoints. ARGV: me, ttl ms, group, consumer.
// Answers {0, owner's ttl ms} (held by another), {1, pending} (taken), {2, 0} (nothing to
// read), {3, 0} (no endpoint: skipped).
var takeScript = redis.NewScript(luaOutbox + `
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  return {0, redis.call('PTTL', KEYS[1])}
end
if redis.call('EXISTS', KEYS[3]) == 0 then return {2, 0} end
local g = group(KEYS[3], ARGV[3])
if not cur and redis.call('EXISTS', KEYS[4]) == 0 and (not g or tonumber(g['pending']) == 0) then
  if #redis.call('XINFO', 'GROUPS', KEYS[3]) == (g and 1 or 0) then
    redis.call('DEL', KEYS[3])
    return {3, 0}
  end
  if not g or g['lag'] ~= 0 then
    if g then redis.call('XGROUP', 'DESTROY', KEYS[3], ARGV[3]) end
    redis.call('XGROUP', 'CREATE', KEYS[3], ARGV[3], '$')
  end
  trim(KEYS[3])
  return {3, 0}
end
if not g then
  redis.call('XGROUP', 'CREATE', KEYS[3], ARGV[3], '0')
  g = group(KEYS[3], ARGV[3])
end
if tonumber(g['pending']) == 0 and g['lag'] == 0 and not cur then
  trim(KEYS[3])
  return {2, 0}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[2])
local others = false
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[3], ARGV[3])) do
  local f = fields(c)
  if f['name'] ~= ARGV[4] then
    others = true
    if tonumber(f['pending']) > 0 then
      local start = '0-0'
      repeat
        start = redis.call('XAUTOCLAIM', KEYS[3], ARGV[3], ARGV[4], 0, start, 'COUNT', 1000, 'JUSTID')[1]
      until start == '0-0'
      break
    end
  end
end
if others then
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[3], ARGV[3])) do
    local f = fields(c)
    if f['name'] ~= ARGV[4] and tonumber(f['pending']) == 0 then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[3], ARGV[3], f['name'])
    end
  end
end
return {1, tonumber(group(KEYS[3], ARGV[3])['pending'])}
`)

// renewScript renews the hold if it is ours. KEYS: owner. ARGV: me, ttl ms. Answers 1 if
// renewed, 0 if lost.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// letGoScript ends a read of the outbox: if another dispatcher asked for one more read
// (the again flag) and force is not set, the hold is kept (renewed) for it; otherwise the
// outbox is trimmed and the hold given up.
//
// KEYS: owner, again, outbox. ARGV: me, ttl ms, group, force (1|0).
// Answers 1 (read again), 0 (let go), -1 (not ours any more).
var letGoScript = redis.NewScript(luaOutbox + `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('EXISTS', KEYS[2]) == 1 and ARGV[4] ~= '1' then
  redis.call('DEL', KEYS[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
trim(KEYS[3])
redis.call('DEL', KEYS[1], KEYS[2])
return 0
`)

// enqueueScript queues one outbox entry's deliveries and acks the entry, atomically, if the
// caller still holds the outbox; an entry already acked is not queued again.
//
// Each failing endpoint's queued bytes (the queued hash) stay within the bound: a task that
// would take it past the bound is not queued for that endpoint, and its log records why
// instead (the delivery JSON given for it). An endpoint is failing from a failed attempt to
// its next success (the hash's failing:<endpoint> field): one that accepts what it is sent,
// however slowly, is sent everything, at least once. An endpoint deleted since the caller listed it gets
// nothing.
//
// KEYS: owner, outbox, due, endpoints, queued, N queues, N logs. ARGV: me, group, entry id,
// now ms, bound, log length, task, N (name, endpoint id, not-queued delivery JSON) triples.
// Answers {-1} (hold lost), {0} (already acked), {1, endpoints not queued for…} (queued).
var enqueueScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
if redis.call('XACK', KEYS[2], ARGV[2], ARGV[3]) == 0 then return {0} end
local n = (#KEYS - 5) / 2
local size = string.len(ARGV[7])
local out = {1}
for i = 1, n do
  local a = 8 + 3 * (i - 1)
  local ep = ARGV[a + 1]
  if redis.call('HEXISTS', KEYS[4], ep) == 1 then
    if redis.call('HEXISTS', KEYS[5], 'failing:' .. ep) == 1 and tonumber(redis.call('HGET', KEYS[5], ep) or '0') + size > tonumber(ARGV[5]) then
      redis.call('XADD', KEYS[5 + n + i], 'MAXLEN', ARGV[6], '*', 'd', ARGV[a + 2])
      table.insert(out, ep)
    else
      redis.call('RPUSH', KEYS[5 + i], ARGV[7])
      redis.call('HINCRBY', KEYS[5], ep, size)
      redis.call('ZADD', KEYS[3], 'NX', ARGV[4], ARGV[a])
    end
  end
end
return out
`)

// claimScript leases up to N due queues: their score becomes the lease's end, which is the
// lease's token too.
//
// KEYS: due. ARGV: now ms, lease end ms, N. Answers {queue names, how many due queues are
// left unleased}.
var claimScript = redis.NewScript(`
local names = {}
if tonumber(ARGV[3]) > 0 then
  names = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
  for _, n in ipairs(names) do redis.call('ZADD', KEYS[1], 'XX', ARGV[2], n) end
end
return {names, redis.call('ZCOUNT', KEYS[1], '-inf', ARGV[1])}
`)

// pickScript leases up to N due projects of the global due set (KEYS[1], store.WebhooksDueKey,
// the one script here that is not a project's): their score becomes the lease's end, so that
// a dispatcher that dies handling one leaves it due again then.
//
// ARGV: now ms, lease end ms, N. Answers {projects, earliest score left (” if none)}.
var pickScript = redis.NewScript(`
local ps = {}
if tonumber(ARGV[3]) > 0 then
  ps = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
  for _, p in ipairs(ps) do redis.call('ZADD', KEYS[1], 'XX', ARGV[2], p) end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {ps, first[2] or ''}
`)

// releaseScript hands a leased queue back, due at once, without counting an attempt.
//
// KEYS: due. ARGV: name, lease end ms, now ms.
var releaseScript = redis.NewScript(`
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if cur and tonumber(cur) == tonumber(ARGV[2]) then redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1]) end
return 0
`)

// dropScript removes a leased queue: all of it (its endpoint is gone, and so is the
// endpoint's count of queued bytes), or only its due entry when the queue is empty.
//
// KEYS: due, queue, meta, queued. ARGV: name, lease end ms, all (1|0), now ms, endpoint id.
var dropScript = redis.NewScript(`
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not cur or tonumber(cur) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] ~= '1' and redis.call('LLEN', KEYS[2]) > 0 then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[4], ARGV[1])
  return 0
end
if ARGV[3] == '1' then redis.call('HDEL', KEYS[4], ARGV[5], 'failing:' .. ARGV[5]) end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
`)

// completeScript records an attempt in the endpoint's log and, if the caller still holds the
// queue's lease, pops the head (done: delivered, which also ends the endpoint's failing mark;
// pop: given up; its bytes leave the endpoint's count either way) or schedules its retry
// (which marks the endpoint failing). An endpoint that is gone loses its queue and its count.
//
// KEYS: due, queue, meta, endpoints, log, queued.
// ARGV: name, lease end ms, done|pop|retry, score (next attempt ms, or now for the next head),
// attempt, first attempt ms, endpoint id, delivery JSON, log length.
// Answers 2 (popped, more queued), 1 (done), 0 (endpoint gone), -1 (lease lost).
var completeScript = redis.NewScript(`
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
local mine = cur and tonumber(cur) == tonumber(ARGV[2])
if redis.call('HEXISTS', KEYS[4], ARGV[7]) == 0 then
  redis.call('HDEL', KEYS[6], ARGV[7], 'failing:' .. ARGV[7])
  if mine then
    redis.call('DEL', KEYS[2], KEYS[3])
    redis.call('ZREM', KEYS[1], ARGV[1])
  end
  return 0
end
redis.call('XADD', KEYS[5], 'MAXLEN', ARGV[9], '*', 'd', ARGV[8])
if not mine then return -1 end
if ARGV[3] == 'retry' then
  redis.call('HSET', KEYS[6], 'failing:' .. ARGV[7], '1')
elseif ARGV[3] == 'done' then
  redis.call('HDEL', KEYS[6], 'failing:' .. ARGV[7])
end
if ARGV[3] ~= 'retry' then
  local t = redis.call('LPOP', KEYS[2])
  -- Tasks queued before the count was kept were never added to it: it stops at 0.
  if t and redis.call('HINCRBY', KEYS[6], ARGV[7], -string.len(t)) <= 0 then redis.call('HDEL', KEYS[6], ARGV[7]) end
  redis.call('DEL', KEYS[3])
  if redis.call('LLEN', KEYS[2]) > 0 then
    redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
    return 2
  end
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
redis.call('HSET', KEYS[3], 'attempt', ARGV[5], 'first', ARGV[6])
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
return 1
`)

// readScript reads outbox entries for the consumer if the caller holds the outbox, so that
// nothing is read once another dispatcher has taken it over.
//
// KEYS: owner, outbox. ARGV: me, group, consumer, count, start id ("0" or ">").
// Answers -1 (not held) or the XREADGROUP reply.
var readScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
return redis.call('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', ARGV[4], 'STREAMS', KEYS[2], ARGV[5])
`)
