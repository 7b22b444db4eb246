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
-- KEYS[12] versions HASH  task id -> version (updated ms) of the live task's envelope
-- KEYS[13] finished ZSET  task id -> version of the envelope its task last finished with
-- ARGV[1] node id
-- ARGV[2] events stream max length (approximate)
-- ARGV[3] ms a finished record is kept (0: none kept, signing off)
-- ARGV[4] the most finished records kept
-- ARGV[5..] groups of 15, one per task:
--   task id, lease token or '' (a request that never was a task), envelope
--   (JSON), now (ms), kind (the kind it died of), url
--   then the learning update (empty field: none): recovery field
--   ("<kind> <domain>"), first bin, last bin, recovered (1/0), half-life (ms), max records
--   then the version of the dead letter's envelope ('' records none: a forged or
--   malformed entry), the event's signature ('' with signing off), and the id the
--   dead letter is kept under ('' for the task's own; a forged entry's is its
--   own, so that it never replaces a dead letter of the task it poses as)
--
-- Returns one integer per task, in order: 1 when dead-lettered; 0 when the
-- lease is stale, or (without a token) when a live task with its id exists;
-- nothing changes for it then.

-- learn() is lua/lib/recovery.lua, record_finished() lua/lib/finished.lua
-- and trim_finished() lua/lib/finishedtrim.lua,
-- prepended to this file when the script is loaded (wire.load_script_source).

local out = {}
local last_now
for i = 5, #ARGV, 15 do
  local id, token = ARGV[i], ARGV[i + 1]
  local dead_id = ARGV[i + 14] ~= '' and ARGV[i + 14] or id
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
    redis.call('HDEL', KEYS[12], id)
    record_finished(KEYS[13], id, ARGV[i + 12], ARGV[i + 3])
    last_now = ARGV[i + 3]
    redis.call('ZADD', KEYS[6], ARGV[i + 3], dead_id)
    redis.call('HSET', KEYS[7], dead_id, ARGV[i + 2])
    redis.call('HSET', KEYS[10], dead_id, ARGV[i + 4])
    redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[2], '*',
      'type', 'dead', 'id', dead_id, 'kind', ARGV[i + 4], 'node', ARGV[1],
      'ts', ARGV[i + 3], 'url', ARGV[i + 5], 'sig', ARGV[i + 13])
    learn(KEYS[11], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8], ARGV[i + 9],
      ARGV[i + 3], ARGV[i + 10], ARGV[i + 11])
    out[#out + 1] = 1
  end
end
if last_now then
  trim_finished(KEYS[13], last_now, ARGV[3], ARGV[4])
end
return out
