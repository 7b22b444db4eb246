-- reschedule: a re-injected request failed again and gets another attempt.
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks    HASH   task id -> envelope
-- KEYS[4] owners   HASH   task id -> lease token
-- KEYS[5] reclaims HASH   task id -> reclaim count
-- KEYS[6] events   STREAM lifecycle events
-- ARGV[1] task id
-- ARGV[2] lease token
-- ARGV[3] new envelope (JSON)
-- ARGV[4] due time (ms)
-- ARGV[5] now (ms)
-- ARGV[6] kind
-- ARGV[7] attempt
-- ARGV[8] node id
-- ARGV[9] url
-- ARGV[10] events stream max length (approximate)
--
-- Returns 1 when rescheduled; 0 when the lease is stale, in which case nothing
-- changes (the node that holds the task now decides its fate).
local id = ARGV[1]
if redis.call('HGET', KEYS[4], id) ~= ARGV[2] then
  return 0
end
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[4], id)
-- The node handled the task, so earlier lease expiries were not its fault.
redis.call('HDEL', KEYS[5], id)
redis.call('HSET', KEYS[3], id, ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[4], id)
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[10], '*',
  'type', 'scheduled', 'id', id, 'kind', ARGV[6], 'attempt', ARGV[7],
  'due', ARGV[4], 'node', ARGV[8], 'ts', ARGV[5], 'url', ARGV[9])
return 1
