-- ack: re-injected requests succeeded; their tasks are done.
--
-- KEYS[1] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[2] tasks    HASH   task id -> envelope
-- KEYS[3] owners   HASH   task id -> lease token
-- KEYS[4] reclaims HASH   task id -> reclaim count
-- KEYS[5] events   STREAM lifecycle events
-- KEYS[6] taskinfo HASH   task id -> "<created ms> <host> <url>"
-- KEYS[7] recovery HASH   "<kind> <domain>" -> learned recovery record (recovery.py)
-- KEYS[8] versions HASH   task id -> version (updated ms) of the live task's envelope
-- KEYS[9] finished ZSET   task id -> version of the envelope its task last finished with
-- ARGV[1] node id
-- ARGV[2] events stream max length (approximate)
-- ARGV[3] ms a finished record is kept (0: none kept, signing off)
-- ARGV[4] the most finished records kept
-- ARGV[5..] groups of 16, one per task:
--   task id, lease token, now (ms), kind of the last failure, url,
--   wait (ms from its first failure to now, '' when not known), domain (host)
--   then the learning update (empty field: none): recovery field
--   ("<kind> <domain>"), first bin, last bin, recovered (1/0), half-life (ms), max records,
--   ms from its first failure to its last failure (0: none before; the recovery is
--   spread between then and wait)
--   then the version of the envelope it finished with ('' records none) and the
--   event's signature ('' with signing off)
--
-- Returns one integer per task, in order: 1 when acknowledged; 0 when the
-- lease is stale (not held with this token any more), in which case nothing
-- changes for it.

-- learn() is lua/lib/recovery.lua, record_finished() lua/lib/finished.lua
-- and trim_finished() lua/lib/finishedtrim.lua,
-- prepended to this file when the script is loaded (wire.load_script_source).

local out = {}
local last_now
for i = 5, #ARGV, 16 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[3], id) ~= ARGV[i + 1] then
    out[#out + 1] = 0
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[8], id)
    record_finished(KEYS[9], id, ARGV[i + 14], ARGV[i + 2])
    last_now = ARGV[i + 2]
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[2], '*',
      'type', 'succeeded', 'id', id, 'kind', ARGV[i + 3], 'node', ARGV[1],
      'ts', ARGV[i + 2], 'url', ARGV[i + 4], 'wait', ARGV[i + 5], 'domain', ARGV[i + 6],
      'sig', ARGV[i + 15])
    learn(KEYS[7], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9], ARGV[i + 10],
      ARGV[i + 2], ARGV[i + 11], ARGV[i + 12], ARGV[i + 13], ARGV[i + 5])
    out[#out + 1] = 1
  end
end
if last_now then
  trim_finished(KEYS[9], last_now, ARGV[3], ARGV[4])
end
return out
