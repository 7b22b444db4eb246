-- ack: re-injected requests succeeded; their tasks are done.
--
-- KEYS[1] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[2] tasks    HASH   task id -> envelope
-- KEYS[3] owners   HASH   task id -> lease token
-- KEYS[4] reclaims HASH   task id -> reclaim count
-- KEYS[5] events   STREAM lifecycle events
-- KEYS[6] taskinfo HASH   task id -> "<created ms> <host> <url>"
-- ARGV[1] node id
-- ARGV[2] events stream max length (approximate)
-- ARGV[3..] groups of 7, one per task:
--   task id, lease token, now (ms), kind of the last failure, url,
--   wait (ms from its first failure to now, '' when not known), domain (host)
--
-- Returns one integer per task, in order: 1 when acknowledged; 0 when the
-- lease is stale (not held with this token any more), in which case nothing
-- changes for it.
local out = {}
for i = 3, #ARGV, 7 do
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
    out[#out + 1] = 1
  end
end
return out
