package store

// StreamTrimLua defines Lua functions for scripts that trim a stream read by consumer groups;
// a script concatenates it before its own text (redis.NewScript(store.StreamTrimLua + `…`)),
// so that the webhooks outbox and the usage streams are trimmed by one text.
//
//   - fields(flat) answers a table of a flat field/value reply (XINFO's).
//   - parseid(id) answers an entry id's ms and seq parts as numbers; an id without its seq
//     part ("0": miniredis reports a group created at "0" so until it delivers) has seq 0.
//   - before(a, b) answers whether entry id a sorts before b.
//   - trim(stream) removes the entries every consumer group has acknowledged: those before
//     the oldest one still pending, or through the last one delivered, in whichever group is
//     furthest behind. An entry read and not acknowledged (its reader died) stays for another
//     consumer to claim; a stream without consumer groups is left whole. XTRIM MINID costs
//     only the entries it removes.
const StreamTrimLua = `
local function fields(flat)
  local f = {}
  for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
  return f
end
local function parseid(id)
  local ms, seq = string.match(id, '^(%d+)-?(%d*)$')
  return tonumber(ms), tonumber(seq) or 0
end
local function before(a, b)
  local ams, aseq = parseid(a)
  local bms, bseq = parseid(b)
  return ams < bms or (ams == bms and aseq < bseq)
end
local function trim(stream)
  if redis.call('EXISTS', stream) == 0 then return end
  local keep = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local f = fields(g)
    local from
    if tonumber(f['pending']) > 0 then
      from = redis.call('XPENDING', stream, f['name'])[2]
    else
      local ms, seq = parseid(f['last-delivered-id'])
      from = string.format('%d-%d', ms, seq + 1)
    end
    if keep == nil or before(from, keep) then keep = from end
  end
  if keep then redis.call('XTRIM', stream, 'MINID', keep) end
end
`
