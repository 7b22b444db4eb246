-- domain_fail: a request to a domain failed in a way that may mean the site is
-- overloaded or throttling us; maybe start (or extend) the domain's cooldown.
--
-- KEYS[1] domains  HASH   domain -> "<state> <until ms> <level> <since ms> <reason>"
-- KEYS[2] cooling  ZSET   domain -> end of its cooldown (ms)
-- KEYS[3] bursts   HASH   domain -> "<window start ms> <failures in the window>"
-- KEYS[4] probes   HASH   domain -> lease expiry (ms) of its half-open probe
-- KEYS[5] events   STREAM lifecycle events
-- ARGV[1] now (ms)
-- ARGV[2] domain (lower-case host name)
-- ARGV[3] cause: 'throttle' (429, 503 + Retry-After) trips at once;
--         'burst' (timeout, connection, 5xx) trips at the threshold
-- ARGV[4] server's wait (ms, Retry-After, capped), 0 when none
-- ARGV[5] cooldown base (ms): the first cooldown lasts at least this long
-- ARGV[6] cooldown max (ms): cap on the domain's own backoff
-- ARGV[7] burst threshold (failures within the window)
-- ARGV[8] burst window (ms)
-- ARGV[9] reason (short text for the event and the state)
-- ARGV[10] node id
-- ARGV[11] events stream max length (approximate)
--
-- A domain is 'cooling' until its 'until'; once that has passed it is
-- half-open: claim.lua lets one probe through. A failure while half-open (the
-- probe's, or any other) extends the cooldown with backoff: level + 1, the
-- domain's own delay base * 2^level (capped), at least the server's wait.
-- A failure while still cooling (a request that was in flight already) only
-- pushes 'until' out to the server's wait (when that is at least a second
-- later), without raising the level.
--
-- A state is plain words, not JSON (no script parses JSON text; domains.py
-- reads it for people). One this version cannot read (an older version's
-- JSON) counts as cooling until the domain's end in cooling, if it has one.
--
-- Returns {changed (0/1), state, until (ms), previous state, level}.
local now = tonumber(ARGV[1])
local domain = ARGV[2]
local cause = ARGV[3]
local wait = tonumber(ARGV[4])

local function encode(s)
  return s.state .. ' ' .. s['until'] .. ' ' .. s.level .. ' ' .. s.since .. ' ' .. s.reason
end

local st = {state = 'open', ['until'] = 0, level = -1, since = now, reason = ''}
local raw = redis.call('HGET', KEYS[1], domain)
if raw then
  local state, till, lvl, since, why =
    string.match(raw, '^(%a+) (%-?%d+) (%-?%d+) (%-?%d+) (.*)$')
  if state then
    st = {state = state, ['until'] = tonumber(till), level = tonumber(lvl),
          since = tonumber(since), reason = why}
  else
    local till = redis.call('ZSCORE', KEYS[2], domain)
    if till then
      st = {state = 'cooling', ['until'] = tonumber(till), level = 0, since = now, reason = ''}
    end
  end
end
local previous = st.state
local half_open = st.state == 'cooling' and tonumber(st['until']) <= now

if st.state == 'cooling' and not half_open then
  local target = now + wait
  -- At least a second more: the in-flight answers of one burst of 429s do
  -- not each make an event.
  if target >= tonumber(st['until']) + 1000 then
    st['until'] = target
    redis.call('HSET', KEYS[1], domain, encode(st))
    redis.call('ZADD', KEYS[2], target, domain)
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[11], '*', 'type', 'domain',
      'domain', domain, 'state', 'cooling', 'previous', 'cooling', 'until', tostring(target),
      'level', tostring(st.level), 'reason', ARGV[9], 'node', ARGV[10], 'ts', ARGV[1])
    return {1, 'cooling', target, previous, st.level}
  end
  return {0, 'cooling', tonumber(st['until']), previous, st.level}
end

if cause == 'burst' and not half_open then
  local count, start = 1, now
  local b = redis.call('HGET', KEYS[3], domain)
  if b then
    local s, c = string.match(b, '^(%d+) (%d+)$')
    if s and now - tonumber(s) < tonumber(ARGV[8]) then
      start, count = tonumber(s), tonumber(c) + 1
    end
  end
  if count < tonumber(ARGV[7]) then
    redis.call('HSET', KEYS[3], domain, start .. ' ' .. count)
    return {0, st.state, 0, previous, st.level}
  end
end

-- Trip: a new cooldown, or a longer one after a failed half-open probe.
local level = half_open and (tonumber(st.level) + 1) or 0
local delay = math.min(tonumber(ARGV[5]) * math.pow(2, level), tonumber(ARGV[6]))
delay = math.max(delay, wait)
local target = now + math.floor(delay)
st = {state = 'cooling', ['until'] = target, level = level, reason = ARGV[9],
      since = (previous == 'cooling') and st.since or now}
redis.call('HSET', KEYS[1], domain, encode(st))
redis.call('ZADD', KEYS[2], target, domain)
redis.call('HDEL', KEYS[3], domain)
redis.call('HDEL', KEYS[4], domain)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[11], '*', 'type', 'domain',
  'domain', domain, 'state', 'cooling', 'previous', previous, 'until', tostring(target),
  'level', tostring(level), 'reason', ARGV[9], 'node', ARGV[10], 'ts', ARGV[1])
return {1, 'cooling', target, previous, level}
