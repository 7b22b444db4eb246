-- deadletter: tasks are given up; keep them as dead letters.
--
-- KEYS[1] due       ZSET   task id -> due time (ms)
-- KEYS[2] leased    ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks     HASH   task id -> envelope
-- KEYS[4] owners    HASH   task id -> lease token
-- KEYS[5] reclaims  HASH   task id -> reclaim count
-- KEYS[6] dead      ZSET   task id -> time of death (ms)
-- KEYS[7] deadtasks HASH   task id -> envelope of the dead letter
-- KEYS[8] events    STREAM lifecycle events
-- KEYS[9] taskinfo  HASH   task id -> "<created ms> <host> <url>" of live tasks
-- KEYS[10] deadkinds HASH  task id -> kind the dead letter died of
-- KEYS[11] recovery HASH  "<kind> <domain>" -> learned recovery record (recovery.py)
-- ARGV[1] node id
-- ARGV[2] events stream max length (approximate)
-- ARGV[3..] groups of 12, one per task:
--   task id, lease token or '' (a request that never was a task), envelope
--   (JSON), now (ms), kind (the kind it died of), url
--   then the learning update (empty field: none): recovery field
--   ("<kind> <domain>"), first bin, last bin, recovered (1/0), half-life (ms), max records
--
-- Returns one integer per task, in order: 1 when dead-lettered; 0 when the
-- lease is stale, or (without a token) when a live task with its id exists;
-- nothing changes for it then.

-- The learning update (recovery.py, Record.add) of KEYS[11]: decay the (kind, domain) record
-- to now, then add one outcome: at-risk weight in bins first..last, and a recovery
-- in bin last when it recovered. A record that does not read as numbers, or longer
-- than RECOVERY_RECORD_MAX (4096) characters or RECOVERY_BINS (36) bins, was not
-- written by this script: it is started over. A new field past max records is not kept.
local function learn(field, first, last, recovered, now, half_life, max_records)
  if field == '' then return end
  first, last = tonumber(first), tonumber(last)
  now, half_life = tonumber(now), tonumber(half_life)
  local raw = redis.call('HGET', KEYS[11], field)
  if not raw and redis.call('HLEN', KEYS[11]) >= tonumber(max_records) then return end
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
  redis.call('HSET', KEYS[11], field, table.concat(out, ' '))
end

local out = {}
for i = 3, #ARGV, 12 do
  local id, token = ARGV[i], ARGV[i + 1]
  local refused
  if token ~= '' then
    refused = redis.call('HGET', KEYS[4], id) ~= token
  else
    refused = redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id)
  end
  if refused then
    out[#out + 1] = 0
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[9], id)
    redis.call('ZADD', KEYS[6], ARGV[i + 3], id)
    redis.call('HSET', KEYS[7], id, ARGV[i + 2])
    redis.call('HSET', KEYS[10], id, ARGV[i + 4])
    redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[2], '*',
      'type', 'dead', 'id', id, 'kind', ARGV[i + 4], 'node', ARGV[1],
      'ts', ARGV[i + 3], 'url', ARGV[i + 5])
    learn(ARGV[i + 6], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9],
      ARGV[i + 3], ARGV[i + 10], ARGV[i + 11])
    out[#out + 1] = 1
  end
end
return out
