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

-- learn() is lua/lib/recovery.lua, prepended to this file when the script is
-- loaded (queue.load_script_source): the learning update of KEYS[7].

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
    learn(KEYS[7], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9], ARGV[i + 10],
      ARGV[i + 2], ARGV[i + 11], ARGV[i + 12])
    out[#out + 1] = 1
  end
end
return out
