-- deadletter: a task is given up; keep it as a dead letter.
--
-- KEYS[1] due       ZSET   task id -> due time (ms)
-- KEYS[2] leased    ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks     HASH   task id -> envelope
-- KEYS[4] owners    HASH   task id -> lease token
-- KEYS[5] reclaims  HASH   task id -> reclaim count
-- KEYS[6] dead      ZSET   task id -> time of death (ms)
-- KEYS[7] deadtasks HASH   task id -> envelope of the dead letter
-- KEYS[8] events    STREAM lifecycle events
-- ARGV[1] task id
-- ARGV[2] lease token, or '' for a request that never was a task
-- ARGV[3] envelope (JSON)
-- ARGV[4] now (ms)
-- ARGV[5] kind
-- ARGV[6] node id
-- ARGV[7] url
-- ARGV[8] events stream max length (approximate)
--
-- Returns 1 when dead-lettered; 0 when the lease is stale, or (without a token)
-- when a live task with this id exists; nothing changes then.
local id = ARGV[1]
if ARGV[2] ~= '' then
  if redis.call('HGET', KEYS[4], id) ~= ARGV[2] then
    return 0
  end
elseif redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id) then
  return 0
end
redis.call('ZREM', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
redis.call('HDEL', KEYS[4], id)
redis.call('HDEL', KEYS[5], id)
redis.call('ZADD', KEYS[6], ARGV[4], id)
redis.call('HSET', KEYS[7], id, ARGV[3])
redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[8], '*',
  'type', 'dead', 'id', id, 'kind', ARGV[5], 'node', ARGV[6], 'ts', ARGV[4],
  'url', ARGV[7])
return 1
