-- recovery: the learning update of a learned recovery record (recovery.py, Record.add),
-- one function shared by ack.lua, reschedule.lua and deadletter.lua. It is no script
-- of its own: queue.load_script_source prepends this file to each of those (queue.SNIPPETS),
-- so Redis loads and caches the combined text, and EVALSHA names its SHA.
--
-- Has no KEYS or ARGV of its own: the one key it touches, recovery, is the caller's,
-- passed in from the caller's KEYS and listed in the caller's header.
--
-- learn(recovery, field, first, last, recovered, now, half_life, max_records, gap_from, gap_to)
--   recovery     the recovery HASH: "<kind> <domain>" -> learned recovery record
--   field        "<kind> <domain>"; '' when the outcome teaches nothing
--   first, last  the bins the outcome newly reached (at risk in them)
--   recovered    '1' when it recovered, else '0'
--   now          the outcome's time (ms); half_life (ms); max_records: the most fields
--   gap_from, gap_to  (a recovery; nil or gap_to <= gap_from: none) ms from the task's
--                first failure to its last failure and to its success
--
-- Returns nothing. Decays the (kind, domain) record to now, then adds one outcome.
-- With a gap, the recovery is spread over it, as it ended somewhere in between: each
-- bin b of first..last is at risk by the share of the gap from its lower edge on
-- (1 when that edge is before gap_from), and each bin the gap overlaps recovers by
-- the share of the gap in it. Bin b's lower edge is RECOVERY_FIRST_EDGE (0.5) s x
-- 2 ^ ((b - 1) / 2) (0 for bin 0); the last bin is open. Without a gap: at-risk
-- weight 1 in bins first..last, and a recovery in bin last when it recovered.
-- A record that does not read as numbers, or longer than RECOVERY_RECORD_MAX (4096)
-- characters or RECOVERY_BINS (36) bins, was not written by this function: it is
-- started over. A new field past max records is not kept.

local function lower_edge(b)
  if b == 0 then return 0 end
  return 0.5 * 2 ^ ((b - 1) / 2)
end

local function learn(recovery, field, first, last, recovered, now, half_life, max_records,
                     gap_from, gap_to)
  if field == '' then return end
  first, last = tonumber(first), tonumber(last)
  local p, w = (tonumber(gap_from) or 0) / 1000, (tonumber(gap_to) or 0) / 1000
  local spread = recovered == '1' and w > p
  local from = first
  if spread and p > 0 then from = first - 1 end
  now, half_life = tonumber(now), tonumber(half_life)
  local raw = redis.call('HGET', recovery, field)
  if not raw and redis.call('HLEN', recovery) >= tonumber(max_records) then return end
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
    if spread then
      local lo = lower_edge(b)
      if b >= first and b <= last then
        if lo <= p then n = n + 1 else n = n + (w - lo) / (w - p) end
      end
      if b >= from and b <= last then
        local hi = math.huge
        if b + 1 < 36 then hi = lower_edge(b + 1) end
        e = e + (math.min(hi, w) - math.max(lo, p)) / (w - p)
      end
    else
      if b >= first and b <= last then n = n + 1 end
      if recovered == '1' and b == last then e = e + 1 end
    end
    out[#out + 1] = string.format('%.10g', n)
    out[#out + 1] = string.format('%.10g', e)
  end
  redis.call('HSET', recovery, field, table.concat(out, ' '))
end

