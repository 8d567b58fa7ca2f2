package store

import "github.com/redis/go-redis/v9"

// tokenBucketLua defines take_token(key, rate, burst, now): a token bucket that refills rate
// tokens per second up to burst and takes one if it can, answering allowed (1|0) and the ms
// until a token is there. One text for the rate limiter's own script and the admission script.
const tokenBucketLua = `
local function take_token(key, rate, burst, now)
  local b = redis.call('HMGET', key, 'tokens', 'ts')
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
  redis.call('HSET', key, 'tokens', tostring(tokens), 'ts', string.format('%.0f', math.max(now, ts)))
  redis.call('PEXPIRE', key, math.ceil(burst * 1000 / rate) + 1000)
  return allowed, wait
end
`

// tokenBucketScript takes one token. KEYS: bucket hash. ARGV: rate per s, burst, now ms.
// Answers {allowed, retry_after_ms}.
var tokenBucketScript = redis.NewScript(tokenBucketLua + `
local allowed, wait = take_token(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
return {allowed, wait}
`)

// writePendingLua writes a pending session (admitScript, reserveScript's commit): ARGV[at] is
// N, then N hash field/value args, then the session.pending event's field/value args; the
// event carries the whole hash. Its callers have checked that no session has the id. KEYS as
// admitScript's: 6 the session hash, 7 the all index, 8 the pending index, 10 the outbox, 11
// the end-user index; KEYS[wh] the project's webhook endpoints. It answers whether it wrote
// the event: not when the project has no webhook endpoint, the outbox's only reader, which
// would skip the event unread (an event goes to the endpoints there are when it is read) and
// delete the outbox. Sparing it, and its signal, is about a seventh of a create's Redis CPU
// (BenchmarkCreateSaturated: 45.7 against 52.7 µs, three alternated pairs). Only creates
// spare it: they are the hot path, and every other event keeps its one writer's rule.
const writePendingLua = `
local function write_pending(id, eu, at, wh)
  local n = tonumber(ARGV[at])
  redis.call('HSET', KEYS[6], unpack(ARGV, at + 1, at + n))
  redis.call('ZADD', KEYS[7], 0, id)
  redis.call('ZADD', KEYS[8], 0, id)
  if eu then redis.call('ZADD', KEYS[11], 0, id) end
  if redis.call('EXISTS', KEYS[wh]) == 0 then return false end
  local e = {unpack(ARGV, at + 1 + n)}
  e[#e + 1] = 'version'
  e[#e + 1] = '1'
  -- The hash is exactly these arguments (no session had the id), so the event copies them
  -- rather than reading the hash back (an HGETALL: 5 of a create's 45 µs of script).
  for i = at + 1, at + n, 2 do e[#e + 1] = 'h.' .. ARGV[i]; e[#e + 1] = ARGV[i + 1] end
  redis.call('XADD', KEYS[10], 'MAXLEN', '~', ` + outboxMaxLenLua + `, '*', unpack(e))
  return true
end
`

// signalCreatedLua defines signal_created(k, at, evented), which makes a create one round trip
// on one Redis: it signals the project's pending work, and its outbox work when write_pending
// wrote the event (evented), and indexes the session's
// provisioning deadline in the script that wrote it. Those keys are global, in other slots
// than the project's on a Cluster, where a script must not touch them: there the caller
// passes none, signal_created does nothing, and the caller signals after (afterCreate).
// KEYS[k], KEYS[k+1], KEYS[k+2]: the pending and outbox signal streams, the provisioning
// deadlines; ARGV[at], ARGV[at+1], ARGV[at+2]: the project, the deadline's member, the
// deadline in ms (empty for none). The same writes as afterCreate's (which signals the outbox
// whatever the create wrote: a signal with nothing new costs the dispatcher one script).
const signalCreatedLua = `
local function signal_created(k, at, evented)
  if #KEYS < k + 2 then return end
  redis.call('XADD', KEYS[k], 'MAXLEN', '~', ` + signalMaxLenLua + `, '*', 'p', ARGV[at])
  if evented then
    redis.call('XADD', KEYS[k + 1], 'MAXLEN', '~', ` + signalMaxLenLua + `, '*', 'p', ARGV[at])
  end
  if ARGV[at + 2] ~= '' then redis.call('ZADD', KEYS[k + 2], 'NX', ARGV[at + 2], ARGV[at + 1]) end
end
`

// capFlagsLua defines cap_flags(eu): the scope whose hard spend cap is reached ('project',
// then 'end_user'; nil for none) and whether a soft one is ('1'|'0'), from the flags KEYS[2]
// to KEYS[5] (project hard, project soft, end-user hard, end-user soft; the end user's only
// when eu). One text for admitScript and reserveScript; one EXISTS over them all answers
// the common case, no flag set (two calls fewer per create, which measured no faster: a
// create's script spends 67 µs, about half in its commands).
const capFlagsLua = `
local function cap_flags(eu)
  local n
  if eu then n = redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
  else n = redis.call('EXISTS', KEYS[2], KEYS[3]) end
  if n == 0 then return nil, '0' end
  if redis.call('EXISTS', KEYS[2]) == 1 then return 'project', '0' end
  if eu and redis.call('EXISTS', KEYS[4]) == 1 then return 'end_user', '0' end
  return nil, '1'
end
`

// admitScript is a create's whole admission in one step: it takes a token from the project's
// rate bucket, checks the month's spend-cap flags, reserves a concurrency slot and writes the
// pending session, its index entries and its outbox event; or it stops at the first refusal
// (the token taken stays taken, as when these were separate calls). A session that exists is
// refused first, before a token is taken. A create whose decision needs the slots in use
// goes through reserveScript instead.
//
// KEYS: rate bucket, project hard cap flag, project soft cap flag, end-user hard cap flag,
// end-user soft cap flag, session hash, all index, pending index, active set, outbox,
// end-user index, webhook endpoints (all of one project: one Cluster slot); on one Redis,
// then signal_created's three
// ARGV: rate per s (0: no bucket), burst, now ms, caps (1|0), id, slot limit, has end user
// (1|0), signal_created's three, N, N hash field/value args, event field/value args
// Answers {'EXISTS'} | {'RATE', wait ms} | {'CAPPED', scope} | {'LIMIT', used} |
// {'OK', soft capped (1|0), used before this one}
var admitScript = redis.NewScript(tokenBucketLua + capFlagsLua + writePendingLua + signalCreatedLua + `
if redis.call('EXISTS', KEYS[6]) == 1 then return {'EXISTS'} end
local rate = tonumber(ARGV[1])
if rate > 0 then
  local allowed, wait = take_token(KEYS[1], rate, tonumber(ARGV[2]), tonumber(ARGV[3]))
  if allowed == 0 then return {'RATE', tostring(wait)} end
end
local eu = ARGV[7] == '1'
local soft = '0'
if ARGV[4] == '1' then
  local capped
  capped, soft = cap_flags(eu)
  if capped then return {'CAPPED', capped} end
end
local used = redis.call('SCARD', KEYS[9])
local id = ARGV[5]
if used >= tonumber(ARGV[6]) then return {'LIMIT', tostring(used)} end
redis.call('SADD', KEYS[9], id)
signal_created(13, 8, write_pending(id, eu, 11, 12))
return {'OK', soft, tostring(used)}
`)

// reserveScript is a create's admission in two steps around its decision, for a decision
// that needs the slots in use: mode 'reserve' takes the token, checks the caps and holds a
// slot (the step admitScript takes first), answering the slots held before it; then, once
// the decision allows, mode 'commit' writes the session as admitScript does, or, when it
// refuses, mode 'release' gives the slot back. A held slot is also an entry of the
// reservations zset scored with when it lapses: 'commit' and 'release' remove it, and
// 'reserve' gives back the slots of lapsed ones (their gateway died in between), so a slot
// is never held for good by a create that never finished. One script for the three modes:
// 'reserve' (run with EVAL's fallback) loads it for the 'commit' that follows in a pipeline.
//
// A held slot has a holder: the token of the request that reserved it last. A retry that
// shares the slot (an Idempotency-Key taken over) becomes its holder, and 'release' gives
// the slot back only for its holder: a request refused, or one whose release is retried in
// the background, cannot take the slot from under the retry that shares it. (A slot held
// from before holders has none, and any release gives it back.)
//
// KEYS: rate bucket, project hard cap flag, project soft cap flag, end-user hard cap flag,
// end-user soft cap flag, session hash, all index, pending index, active set, outbox,
// end-user index, reservations, their holders, webhook endpoints (all of one project: one
// Cluster slot); for commit on one Redis, then signal_created's three
// ARGV: mode (reserve|commit|release), id, has end user (1|0), then
// reserve: rate per s (0: no bucket), burst, now ms, caps (1|0), slot limit, lapse ms, token
// commit: signal_created's three, N, N hash field/value args, event field/value args
// release: token
// Answers, reserve: {'RATE', wait ms} | {'CAPPED', scope} | {'EXISTS'|'FULL'|'HELD', soft
// capped (1|0), used before this one} (only 'HELD' holds a slot); commit: {'OK'} |
// {'EXISTS'} | {'LAPSED'}; release: {'OK'}
var reserveScript = redis.NewScript(tokenBucketLua + capFlagsLua + writePendingLua + signalCreatedLua + `
local mode, id, eu = ARGV[1], ARGV[2], ARGV[3] == '1'
if mode == 'release' then
  -- A session written under this id owns the slot (a commit whose answer was lost), and a
  -- retry that took it over holds it.
  local holder = redis.call('HGET', KEYS[13], id)
  if holder and holder ~= ARGV[4] then return {'OK'} end
  redis.call('HDEL', KEYS[13], id)
  if redis.call('ZREM', KEYS[12], id) == 1 and redis.call('EXISTS', KEYS[6]) == 0 then
    redis.call('SREM', KEYS[9], id)
  end
  -- (A session's id leaves the reservations either way: left there, it would lapse, and the
  -- lapse would take the session's own slot.)
  return {'OK'}
end
if mode == 'commit' then
  redis.call('HDEL', KEYS[13], id)
  if redis.call('EXISTS', KEYS[6]) == 1 then
    redis.call('ZREM', KEYS[12], id)
    return {'EXISTS'}
  end
  if redis.call('ZREM', KEYS[12], id) == 0 then return {'LAPSED'} end
  signal_created(15, 4, write_pending(id, eu, 7, 14))
  return {'OK'}
end
local rate, now = tonumber(ARGV[4]), tonumber(ARGV[6])
local held = redis.call('ZSCORE', KEYS[12], id)
if held and tonumber(held) > now then
  -- Held already under this id: the same Reserve sent again after its answer was lost, or a
  -- retry that took an Idempotency-Key over from a request that has not finished. It takes
  -- no second token, and is not refused by what the bucket holds: they share the one slot,
  -- and the first to commit writes the session.
  redis.call('ZADD', KEYS[12], string.format('%.0f', now + tonumber(ARGV[9])), id)
  redis.call('HSET', KEYS[13], id, ARGV[10])
  return {'HELD', '0', tostring(redis.call('SCARD', KEYS[9]) - 1)}
end
if rate > 0 then
  local allowed, wait = take_token(KEYS[1], rate, tonumber(ARGV[5]), now)
  if allowed == 0 then return {'RATE', tostring(wait)} end
end
local soft = '0'
if ARGV[7] == '1' then
  local capped
  capped, soft = cap_flags(eu)
  if capped then return {'CAPPED', capped} end
end
for _, lapsed in ipairs(redis.call('ZRANGEBYSCORE', KEYS[12], '-inf', now, 'LIMIT', 0, 16)) do
  redis.call('ZREM', KEYS[12], lapsed)
  redis.call('SREM', KEYS[9], lapsed)
  redis.call('HDEL', KEYS[13], lapsed)
end
local used = redis.call('SCARD', KEYS[9])
if redis.call('EXISTS', KEYS[6]) == 1 then return {'EXISTS', soft, tostring(used)} end
local lapse = string.format('%.0f', now + tonumber(ARGV[9]))
if redis.call('SISMEMBER', KEYS[9], id) == 1 then
  -- Held already under this id: a retry that took an Idempotency-Key over from a request
  -- that has not finished. They share the one slot; the first to commit writes the session.
  redis.call('ZADD', KEYS[12], lapse, id)
  redis.call('HSET', KEYS[13], id, ARGV[10])
  return {'HELD', soft, tostring(used - 1)}
end
if used >= tonumber(ARGV[8]) then return {'FULL', soft, tostring(used)} end
redis.call('SADD', KEYS[9], id)
redis.call('ZADD', KEYS[12], lapse, id)
redis.call('HSET', KEYS[13], id, ARGV[10])
return {'HELD', soft, tostring(used)}
`)

// transitionScript compares state (and version, unless 0), writes the new state and the
// timestamps it implies, moves the session between state indexes, releases the slot and sets
// a retention TTL on a terminal state, and appends the event, which carries the whole hash
// (fields prefixed "h.") so consumers see the session as of that version. It answers the hash.
//
// A session's hash names the snapshot it takes while snapshotting (field snap, written with
// the transition to it, as an extra field): a transition from snapshotting that names a
// snapshot applies only while the session takes that one ({'SNAPSHOT', the one it takes});
// a hash without the field (written before it existed) takes any.
//
// On one Redis it also keeps the global indexes and signals the outbox (Transition's
// afterTransition does that on a Cluster, where those keys are in other slots): with the
// keys of the outbox's signal stream and the provisioning deadlines, it signals, and drops
// the deadline of a session that leaves pending and provisioning; with the node's session
// set as well (a transition that names the node), it adds the session to it, unless the
// session ends.
//
// A session that leaves pending and provisioning (it runs, or stops or ends first) is
// published on StartsChannel, for the gateway whose run waits for it (Store.WatchStarts).
//
// A session that ends joins the project's retained set (its id and end user, scored with
// when its retention lapses), from which trimRetained later drops its index entries.
//
// KEYS: session hash, from-state index, to-state index, active set, outbox, retained set; on
// one Redis, then the outbox signal stream, the provisioning deadlines and, for a named node,
// its set
// ARGV: id, from, to, expected version, reason, rule, now ms, terminal (1|0), retention s,
// project, the session's member of the global indexes, expected snapshot (empty: any), N,
// N extra hash field/value args, event field/value args
var transitionScript = redis.NewScript(`
local id, from, to, now = ARGV[1], ARGV[2], ARGV[3], ARGV[7]
local cur = redis.call('HMGET', KEYS[1], 'state', 'ver', 'reason', 'life_s', 'snap')
if not cur[1] then return {'NOTFOUND'} end
if cur[1] ~= from or (ARGV[4] ~= '0' and cur[2] ~= ARGV[4]) then
  return {'CONFLICT', cur[1], cur[2]}
end
if from == 'snapshotting' then
  if ARGV[12] ~= '' and cur[5] and cur[5] ~= ARGV[12] then return {'SNAPSHOT', cur[5], cur[2]} end
end
if from == 'snapshotting' or to == 'snapshotting' then
  -- Forgotten on the way in too: a gateway from before the field left it in place on the way
  -- out, and a snapshot that names none must not inherit it. One that names its own sets it
  -- again below, among the extra fields.
  redis.call('HDEL', KEYS[1], 'snap')
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
  local ok, doc = pcall(cjson.decode, redis.call('HGET', KEYS[1], 'doc') or '')
  local eu = ok and type(doc) == 'table' and doc.end_user_id
  if type(eu) ~= 'string' then eu = '' end
  redis.call('ZADD', KEYS[6], tonumber(now) + 1000 * tonumber(ARGV[9]), id .. '/' .. eu)
end
local n = tonumber(ARGV[13])
if n > 0 then
  local h = {}
  for i = 14, 13 + n do h[#h + 1] = ARGV[i] end
  redis.call('HSET', KEYS[1], unpack(h))
end
redis.call('ZREM', KEYS[2], id)
redis.call('ZADD', KEYS[3], 0, id)
local placing = {pending = true, provisioning = true}
local placed = placing[from] and not placing[to]
-- A channel is no key: on a Cluster too, where the PUBLISH reaches every node's subscribers.
if placed then redis.call('PUBLISH', '` + StartsChannel + `', ARGV[11]) end
if #KEYS >= 8 then
  redis.call('XADD', KEYS[7], 'MAXLEN', '~', ` + signalMaxLenLua + `, '*', 'p', ARGV[10])
  if placed then redis.call('ZREM', KEYS[8], ARGV[11]) end
  if KEYS[9] and ARGV[8] ~= '1' then redis.call('SADD', KEYS[9], ARGV[11]) end
end
local e = {}
for i = 14 + n, #ARGV do e[#e + 1] = ARGV[i] end
e[#e + 1] = 'version'
e[#e + 1] = ver
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do e[#e + 1] = 'h.' .. all[i]; e[#e + 1] = all[i + 1] end
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ` + outboxMaxLenLua + `, '*', unpack(e))
return all
`)
