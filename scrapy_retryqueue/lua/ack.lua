-- ack: a re-injected request succeeded; its task is done.
--
-- KEYS[1] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[2] tasks    HASH   task id -> envelope
-- KEYS[3] owners   HASH   task id -> lease token
-- KEYS[4] reclaims HASH   task id -> reclaim count
-- KEYS[5] events   STREAM lifecycle events
-- ARGV[1] task id
-- ARGV[2] lease token
-- ARGV[3] now (ms)
-- ARGV[4] node id
-- ARGV[5] kind of the last failure
-- ARGV[6] url
-- ARGV[7] events stream max length (approximate)
--
-- Returns 1 when acknowledged; 0 when the lease is stale (not held with this
-- token any more), in which case nothing changes.
local id = ARGV[1]
if redis.call('HGET', KEYS[3], id) ~= ARGV[2] then
  return 0
end
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[3], id)
redis.call('HDEL', KEYS[4], id)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[7], '*',
  'type', 'succeeded', 'id', id, 'kind', ARGV[5], 'node', ARGV[4], 'ts', ARGV[3],
  'url', ARGV[6])
return 1
