-- cancel: force-terminate live tasks (waiting or leased); they are not retried.
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks    HASH   task id -> envelope
-- KEYS[4] owners   HASH   task id -> lease token
-- KEYS[5] reclaims HASH   task id -> reclaim count
-- KEYS[6] events   STREAM lifecycle events
-- KEYS[7] taskinfo HASH   task id -> "<created ms> <host> <url>"
-- ARGV[1] node id (of the dashboard or command that asks)
-- ARGV[2] events stream max length (approximate)
-- ARGV[3] now (ms)
-- ARGV[4..] pairs: task id, its url ('' when not known; read by the caller,
--           since no script reads an envelope)
--
-- A leased task's node loses its lease: its later ack, reschedule or
-- dead-letter of the task is refused as stale. Each task removed gets a
-- 'cancelled' event with the url given.
-- Returns one integer per task id, in order: 1 cancelled; 0 not live.
local out = {}
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[7], id)
    redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[2], '*',
      'type', 'cancelled', 'id', id, 'node', ARGV[1], 'ts', ARGV[3], 'url', ARGV[i + 1])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
