package webhooks

import "github.com/redis/go-redis/v9"

// Every script touches the keys of one project only (one Cluster slot).

// holdScript takes or renews the hold on a project's outbox.
//
// KEYS: owner. ARGV: me, ttl ms. Answers 1 if newly taken, 2 if renewed, 0 if another holds it.
// createScript adds an endpoint unless the project already has ARGV[3]: 1 if added, else 0.
// KEYS: endpoints. ARGV: id, endpoint JSON, max.
var createScript = redis.NewScript(`
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
`)

var holdScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 2
end
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
`)

// letGoScript gives up the hold if it is ours. KEYS: owner. ARGV: me.
var letGoScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
`)

// enqueueScript queues one outbox entry's deliveries and acks the entry, atomically, if the
// caller still holds the outbox; an entry already acked is not queued again.
//
// KEYS: owner, outbox, due, N queues. ARGV: me, group, entry id, now ms, N (name, task) pairs.
// Answers -1 (hold lost), 0 (already acked), 1 (queued).
var enqueueScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('XACK', KEYS[2], ARGV[2], ARGV[3]) == 0 then return 0 end
for i = 4, #KEYS do
  local a = 5 + 2 * (i - 4)
  redis.call('RPUSH', KEYS[i], ARGV[a + 1])
  redis.call('ZADD', KEYS[3], 'NX', ARGV[4], ARGV[a])
end
return 1
`)

// claimScript leases up to N due queues: their score becomes the lease's end, which is the
// lease's token too.
//
// KEYS: due. ARGV: now ms, lease end ms, N. Answers the queue names.
var claimScript = redis.NewScript(`
local names = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, n in ipairs(names) do redis.call('ZADD', KEYS[1], 'XX', ARGV[2], n) end
return names
`)

// releaseScript hands a leased queue back, due at once, without counting an attempt.
//
// KEYS: due. ARGV: name, lease end ms, now ms.
var releaseScript = redis.NewScript(`
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if cur and tonumber(cur) == tonumber(ARGV[2]) then redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1]) end
return 0
`)

// dropScript removes a leased queue: all of it (its endpoint is gone), or only its due entry
// when the queue is empty.
//
// KEYS: due, queue, meta. ARGV: name, lease end ms, all (1|0), now ms.
var dropScript = redis.NewScript(`
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not cur or tonumber(cur) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] ~= '1' and redis.call('LLEN', KEYS[2]) > 0 then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[4], ARGV[1])
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
`)

// completeScript records an attempt in the endpoint's log and, if the caller still holds the
// queue's lease, pops the head (done) or schedules its retry.
//
// KEYS: due, queue, meta, endpoints, log.
// ARGV: name, lease end ms, pop|retry, score (next attempt ms, or now for the next head),
// attempt, first attempt ms, endpoint id, delivery JSON, log length.
// Answers 2 (popped, more queued), 1 (done), 0 (endpoint gone), -1 (lease lost).
var completeScript = redis.NewScript(`
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
local mine = cur and tonumber(cur) == tonumber(ARGV[2])
if redis.call('HEXISTS', KEYS[4], ARGV[7]) == 0 then
  if mine then
    redis.call('DEL', KEYS[2], KEYS[3])
    redis.call('ZREM', KEYS[1], ARGV[1])
  end
  return 0
end
redis.call('XADD', KEYS[5], 'MAXLEN', ARGV[9], '*', 'd', ARGV[8])
if not mine then return -1 end
if ARGV[3] == 'pop' then
  redis.call('LPOP', KEYS[2])
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

// autoclaimScript moves pending outbox entries idle for min-idle ms to the consumer if the
// caller holds the outbox.
//
// KEYS: owner, outbox. ARGV: me, group, consumer, min-idle ms, start, count.
// Answers -1 (not held) or {next start, claimed ids}.
var autoclaimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local r = redis.call('XAUTOCLAIM', KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[5], 'COUNT', ARGV[6], 'JUSTID')
return {r[1], r[2]}
`)
