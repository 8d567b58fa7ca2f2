package store

// A project's stored output (each run's, kept 7 days, up to 16 MiB a run, and each answer
// kept for an Idempotency-Key's replays, 24 h, up to 17 MiB) is bounded by a byte budget per
// project (the gateway's MaxStoredOutputBytes, 1 GiB by default). A write that keeps output
// never fails for it: past the budget, the oldest stored outputs are dropped, each key
// rewritten (KEEPTTL) with the stub recorded beside it (a run without its output, marked
// output_expired; an answer saying its replay was dropped), until the project is back within
// it. The accounting (ProjectKeys.keptKeys) is written in the script that writes the output,
// so that it is exact, and it is cheap: a few commands a write; outputs that expired are
// forgotten as later writes come (by their expiry, which differs by kind: hence two sets).

// keptOutputMin is the smallest output that counts against the budget: a record with less is
// about the size of a session's, which no byte budget bounds either, and a stub beside it
// would cost as much as it saves.
const keptOutputMin = 4 << 10

// keptForgetMost bounds the expired outputs one write's drop loop forgets (keepLua), so that
// one script stays short however large the backlog.
const keptForgetMost = "16384"

// keepLua defines keep(i, member, size, stub, expires, now, budget): it counts key member,
// size bytes written at now (ms) that expire at expires (ms), against budget, with stub as
// what to rewrite the key to, then drops the oldest outputs until the project is within
// budget (an output over the budget alone is dropped at once, and nothing else for it).
// KEYS[i] to KEYS[i+3] are ProjectKeys.keptKeys; the members are keys of the same
// project (one Cluster slot). It answers how many outputs it dropped.
//
// Outputs that expired are forgotten a few at a time as writes come, and all of them before
// any live output is dropped: they still count until forgotten, and a live output dropped
// for them would be dropped for room that is free already (answers expire after a day, runs
// after seven: a backlog of expired answers sits among live runs). A key is rewritten to its
// stub only while it holds what was counted (its length as written): one that expired and
// was made anew since (an Idempotency-Key used again, whose expiry a gateway with a slower
// clock does not see yet) is another record, not to be overwritten with the old one's stub.
// kept_forget(i, member) forgets a key's output, as a script that makes the key anew does:
// from every set, even one whose size is missing (evicted, or deleted by hand), which the drop
// loop would otherwise find again on every pass, for ever, Redis answering BUSY meanwhile.
// The loop forgets at most keptForgetMost expired outputs a write: a larger backlog goes over
// the writes after it, the project over its budget until then.
const keepLua = `
local function kept_forget(i, m)
  local sz = redis.call('HGET', KEYS[i + 2], m)
  if sz then redis.call('HINCRBY', KEYS[i + 2], 'total', -tonumber(sz)) end
  redis.call('HDEL', KEYS[i + 2], m)
  redis.call('HDEL', KEYS[i + 3], m)
  redis.call('ZREM', KEYS[i], m)
  redis.call('ZREM', KEYS[i + 1], m)
end
local function kept_expire(i, now, n)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[i + 1], '-inf', now, 'LIMIT', 0, n)
  for _, g in ipairs(gone) do kept_forget(i, g) end
  return #gone
end
local function keep(i, m, size, stub, expires, now, budget)
  kept_expire(i, now, 64)
  kept_forget(i, m)
  if size > budget then -- over the budget alone: it goes, and nothing else for it
    redis.call('SET', m, stub, 'XX', 'KEEPTTL')
    return 1
  end
  redis.call('ZADD', KEYS[i], now, m)
  redis.call('ZADD', KEYS[i + 1], expires, m)
  redis.call('HSET', KEYS[i + 2], m, size)
  redis.call('HINCRBY', KEYS[i + 2], 'total', size)
  redis.call('HSET', KEYS[i + 3], m, stub)
  local dropped, forgot = 0, 0
  while (tonumber(redis.call('HGET', KEYS[i + 2], 'total')) or 0) > budget do
    local n = 0
    if forgot < ` + keptForgetMost + ` then n = kept_expire(i, now, 256) end
    forgot = forgot + n
    if forgot >= ` + keptForgetMost + ` and n > 0 then break end
    if n == 0 then
      local head = redis.call('ZRANGE', KEYS[i], 0, 0)
      if #head == 0 then break end
      local st = redis.call('HGET', KEYS[i + 3], head[1])
      local sz = tonumber(redis.call('HGET', KEYS[i + 2], head[1]))
      if st and redis.call('STRLEN', head[1]) == sz then redis.call('SET', head[1], st, 'XX', 'KEEPTTL') end
      kept_forget(i, head[1])
      dropped = dropped + 1
    end
  end
  local last = redis.call('ZRANGE', KEYS[i + 1], -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3])
  else
    for j = i, i + 3 do redis.call('PEXPIREAT', KEYS[j], last[2]) end
  end
  return dropped
end
`
