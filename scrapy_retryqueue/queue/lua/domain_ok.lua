-- domain_ok: a request to a domain succeeded; a half-open domain reopens.
--
-- KEYS[1] domains  HASH   domain -> "<state> <until ms> <level> <since ms> <reason>"
-- KEYS[2] cooling  ZSET   domain -> end of its cooldown (ms)
-- KEYS[3] bursts   HASH   domain -> burst counter
-- KEYS[4] probes   HASH   domain -> probe lease expiry (ms)
-- KEYS[5] events   STREAM lifecycle events
-- ARGV[1] now (ms)
-- ARGV[2] domain
-- ARGV[3] node id
-- ARGV[4] events stream max length (approximate)
--
-- A success while the domain still cools down (a request that was in flight
-- before the cooldown began) changes nothing. Once the cooldown has ended, a
-- success (normally the probe's) forgets the domain's state: it is open again.
-- A state this version cannot read (an older version's JSON) ends with the
-- domain's end in cooling.
-- Returns 1 when the domain reopened, else 0.
local raw = redis.call('HGET', KEYS[1], ARGV[2])
if not raw then
  return 0
end
local state, till, level = string.match(raw, '^(%a+) (%-?%d+) (%-?%d+) ')
if not state then
  state, level = 'cooling', 0
  till = redis.call('ZSCORE', KEYS[2], ARGV[2]) or 0
end
if state == 'cooling' and tonumber(till) > tonumber(ARGV[1]) then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[4], ARGV[2])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[4], '*', 'type', 'domain',
  'domain', ARGV[2], 'state', 'open', 'previous', state, 'until', '0',
  'level', tostring(level), 'reason', 'probe succeeded', 'node', ARGV[3], 'ts', ARGV[1])
return 1
