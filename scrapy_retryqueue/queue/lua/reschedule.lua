-- reschedule: re-injected requests failed again and get another attempt.
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks    HASH   task id -> envelope
-- KEYS[4] owners   HASH   task id -> lease token
-- KEYS[5] reclaims HASH   task id -> reclaim count
-- KEYS[6] events   STREAM lifecycle events
-- KEYS[7] taskinfo HASH   task id -> "<created ms> <host> <url>" (what claim reads)
-- KEYS[8] recovery HASH   "<kind> <domain>" -> learned recovery record (recovery.py)
-- KEYS[9] versions HASH   task id -> version (the envelope's updated ms) of the live task
-- ARGV[1] node id
-- ARGV[2] events stream max length (approximate)
-- ARGV[3..] groups of 17, one per task:
--   task id, lease token, new envelope (JSON), due time (ms), now (ms), kind,
--   attempt, url, task info (the taskinfo value, made by Python: taskinfo.py)
--   then the learning update (empty field: none): recovery field
--   ("<kind> <domain>"), first bin, last bin, recovered (1/0), half-life (ms), max records
--   then the version ('' with signing off: the record is removed) and the event
--   signature ('' for none)
--
-- Returns one integer per task, in order: 1 when rescheduled; 0 when the lease
-- is stale, in which case nothing changes for it (the node that holds the task
-- now decides its fate).

-- learn() is lua/lib/recovery.lua, prepended to this file when the script is
-- loaded (queue.load_script_source): the learning update of KEYS[8].

local out = {}
for i = 3, #ARGV, 17 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[4], id) ~= ARGV[i + 1] then
    out[#out + 1] = 0
  else
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[4], id)
    -- The node handled the task, so earlier lease expiries were not its fault.
    redis.call('HDEL', KEYS[5], id)
    redis.call('HSET', KEYS[3], id, ARGV[i + 2])
    redis.call('HSET', KEYS[7], id, ARGV[i + 8])
    if ARGV[i + 15] ~= '' then
      redis.call('HSET', KEYS[9], id, ARGV[i + 15])
    else
      redis.call('HDEL', KEYS[9], id)
    end
    redis.call('ZADD', KEYS[1], ARGV[i + 3], id)
    redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[2], '*',
      'type', 'scheduled', 'id', id, 'kind', ARGV[i + 5], 'attempt', ARGV[i + 6],
      'due', ARGV[i + 3], 'node', ARGV[1], 'ts', ARGV[i + 4], 'url', ARGV[i + 7],
      'sig', ARGV[i + 16])
    learn(KEYS[8], ARGV[i + 9], ARGV[i + 10], ARGV[i + 11], ARGV[i + 12],
      ARGV[i + 4], ARGV[i + 13], ARGV[i + 14])
    out[#out + 1] = 1
  end
end
return out
