-- cancel: force-terminate live tasks (waiting or leased); they are not retried.
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks    HASH   task id -> envelope
-- KEYS[4] owners   HASH   task id -> lease token
-- KEYS[5] reclaims HASH   task id -> reclaim count
-- KEYS[6] events   STREAM lifecycle events
-- KEYS[7] taskinfo HASH   task id -> "<created ms> <host> <url>"
-- KEYS[8] versions HASH   task id -> version (updated ms) of the live task's envelope
-- KEYS[9] finished ZSET   task id -> version of the envelope its task last finished with
-- ARGV[1] node id (of the dashboard or command that asks)
-- ARGV[2] events stream max length (approximate)
-- ARGV[3] now (ms)
-- ARGV[4..] groups of 3: task id, its url ('' when not known; read by the caller,
--           since no script reads an envelope), the event's signature ('' with
--           signing off)
--
-- A cancelled task's finished record is the version recorded beside it (none
-- with signing off).
--
-- A leased task's node loses its lease: its later ack, reschedule or
-- dead-letter of the task is refused as stale. Each task removed gets a
-- 'cancelled' event with the url given.
-- Returns one integer per task id, in order: 1 cancelled; 0 not live.

-- record_finished() is lua/lib/finished.lua, prepended to this file when the script is loaded.

local out = {}
for i = 4, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[7], id)
    record_finished(KEYS[9], id, redis.call('HGET', KEYS[8], id) or '', ARGV[3])
    redis.call('HDEL', KEYS[8], id)
    redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[2], '*',
      'type', 'cancelled', 'id', id, 'node', ARGV[1], 'ts', ARGV[3], 'url', ARGV[i + 1],
      'sig', ARGV[i + 2])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
