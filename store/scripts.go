package store

import "github.com/redis/go-redis/v9"

// createScript reserves a concurrency slot and writes a pending session, its index entries
// and its outbox event, or changes nothing.
//
// KEYS: session hash, all index, pending index, active set, outbox, end-user index
// ARGV: id, slot limit, has end user (1|0), N, N hash field/value args, event field/value args
var createScript = redis.NewScript(`
local id = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 1 then return {'EXISTS'} end
local used = redis.call('SCARD', KEYS[4])
if used >= tonumber(ARGV[2]) then return {'LIMIT', tostring(used)} end
redis.call('SADD', KEYS[4], id)
local n = tonumber(ARGV[4])
local h = {}
for i = 5, 4 + n do h[#h + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(h))
redis.call('ZADD', KEYS[2], 0, id)
redis.call('ZADD', KEYS[3], 0, id)
if ARGV[3] == '1' then redis.call('ZADD', KEYS[6], 0, id) end
local e = {}
for i = 5 + n, #ARGV do e[#e + 1] = ARGV[i] end
e[#e + 1] = 'version'
e[#e + 1] = '1'
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do e[#e + 1] = 'h.' .. all[i]; e[#e + 1] = all[i + 1] end
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ` + outboxMaxLenLua + `, '*', unpack(e))
return {'OK'}
`)

// transitionScript compares state (and version, unless 0), writes the new state and the
// timestamps it implies, moves the session between state indexes, releases the slot and sets
// a retention TTL on a terminal state, and appends the event, which carries the whole hash
// (fields prefixed "h.") so consumers see the session as of that version. It answers the hash.
//
// KEYS: session hash, from-state index, to-state index, active set, outbox
// ARGV: id, from, to, expected version, reason, rule, now ms, terminal (1|0), retention s,
// N, N extra hash field/value args, event field/value args
var transitionScript = redis.NewScript(`
local id, from, to, now = ARGV[1], ARGV[2], ARGV[3], ARGV[7]
local cur = redis.call('HMGET', KEYS[1], 'state', 'ver', 'reason', 'life_s')
if not cur[1] then return {'NOTFOUND'} end
if cur[1] ~= from or (ARGV[4] ~= '0' and cur[2] ~= ARGV[4]) then
  return {'CONFLICT', cur[1], cur[2]}
end
local stored = cur[3] or ''
if from == 'stopping' and stored ~= '' and ARGV[5] ~= stored and ARGV[5] ~= 'host_failure' then
  return {'REASON', stored}
end
local ver = tostring(tonumber(cur[2]) + 1)
redis.call('HSET', KEYS[1], 'state', to, 'ver', ver)
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'reason', ARGV[5], 'rule', ARGV[6]) end
if to == 'running' then
  if from == 'provisioning' then
    local exp = string.format('%.0f', tonumber(now) + 1000 * tonumber(cur[4]))
    redis.call('HSET', KEYS[1], 'started', now, 'expires', exp, 'activity', now)
  elseif from == 'paused' then
    redis.call('HSET', KEYS[1], 'paused', '', 'activity', now)
  end
elseif to == 'paused' then
  redis.call('HSET', KEYS[1], 'paused', now)
end
if ARGV[8] == '1' then
  redis.call('HSET', KEYS[1], 'stopped', now)
  redis.call('SREM', KEYS[4], id)
  redis.call('EXPIRE', KEYS[1], ARGV[9])
end
local n = tonumber(ARGV[10])
if n > 0 then
  local h = {}
  for i = 11, 10 + n do h[#h + 1] = ARGV[i] end
  redis.call('HSET', KEYS[1], unpack(h))
end
redis.call('ZREM', KEYS[2], id)
redis.call('ZADD', KEYS[3], 0, id)
local e = {}
for i = 11 + n, #ARGV do e[#e + 1] = ARGV[i] end
e[#e + 1] = 'version'
e[#e + 1] = ver
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do e[#e + 1] = 'h.' .. all[i]; e[#e + 1] = all[i + 1] end
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ` + outboxMaxLenLua + `, '*', unpack(e))
return all
`)
