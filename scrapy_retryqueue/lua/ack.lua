-- ack: re-injected requests succeeded; their tasks are done.
--
-- KEYS[1] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[2] tasks    HASH   task id -> envelope
-- KEYS[3] owners   HASH   task id -> lease token
-- KEYS[4] reclaims HASH   task id -> reclaim count
-- KEYS[5] events   STREAM lifecycle events
-- KEYS[6] taskinfo HASH   task id -> "<created ms> <host> <url>"
-- KEYS[7] recovery HASH   "<kind> <domain>" -> learned recovery record (recovery.py)
-- ARGV[1] node id
-- ARGV[2] events stream max length (approximate)
-- ARGV[3..] groups of 13, one per task:
--   task id, lease token, now (ms), kind of the last failure, url,
--   wait (ms from its first failure to now, '' when not known), domain (host)
--   then the learning update (empty field: none): recovery field
--   ("<kind> <domain>"), first bin, last bin, recovered (1/0), half-life (ms), max records
--
-- Returns one integer per task, in order: 1 when acknowledged; 0 when the
-- lease is stale (not held with this token any more), in which case nothing
-- changes for it.

-- The learning update (recovery.py, Record.add) of KEYS[7]: decay the (kind, domain) record
-- to now, then add one outcome: at-risk weight in bins first..last, and a recovery
-- in bin last when it recovered. A record that does not read as numbers, or longer
-- than RECOVERY_RECORD_MAX (4096) characters or RECOVERY_BINS (36) bins, was not
-- written by this script: it is started over. A new field past max records is not kept.
local function learn(field, first, last, recovered, now, half_life, max_records)
  if field == '' then return end
  first, last = tonumber(first), tonumber(last)
  now, half_life = tonumber(now), tonumber(half_life)
  local raw = redis.call('HGET', KEYS[7], field)
  if not raw and redis.call('HLEN', KEYS[7]) >= tonumber(max_records) then return end
  local updated, vals, count = now, {}, 0
  if raw and #raw <= 4096 then
    for tok in string.gmatch(raw, '%S+') do
      local x = tonumber(tok)
      if not x or x ~= x or x < 0 or x == math.huge then count = -1 break end
      if count == 0 then updated = x else vals[count] = x end
      count = count + 1
    end
    if count < 1 or count % 2 == 0 or count > 73 then updated, vals, count = now, {}, 1 end
  else
    count = 1
  end
  if updated > now then updated = now end
  local factor = 1
  if now > updated and half_life > 0 then factor = 0.5 ^ ((now - updated) / half_life) end
  local bins = math.max((count - 1) / 2, last + 1)
  local out = {string.format('%d', now)}
  for b = 0, bins - 1 do
    local n = (vals[2 * b + 1] or 0) * factor
    local e = (vals[2 * b + 2] or 0) * factor
    if b >= first and b <= last then n = n + 1 end
    if recovered == '1' and b == last then e = e + 1 end
    out[#out + 1] = string.format('%.10g', n)
    out[#out + 1] = string.format('%.10g', e)
  end
  redis.call('HSET', KEYS[7], field, table.concat(out, ' '))
end

local out = {}
for i = 3, #ARGV, 13 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[3], id) ~= ARGV[i + 1] then
    out[#out + 1] = 0
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[2], '*',
      'type', 'succeeded', 'id', id, 'kind', ARGV[i + 3], 'node', ARGV[1],
      'ts', ARGV[i + 2], 'url', ARGV[i + 4], 'wait', ARGV[i + 5], 'domain', ARGV[i + 6])
    learn(ARGV[i + 7], ARGV[i + 8], ARGV[i + 9], ARGV[i + 10],
      ARGV[i + 2], ARGV[i + 11], ARGV[i + 12])
    out[#out + 1] = 1
  end
end
return out
