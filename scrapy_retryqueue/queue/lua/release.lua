-- release: a node shutting down hands back the tasks it claimed but did not finish.
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] owners   HASH   task id -> lease token
-- KEYS[4] events   STREAM lifecycle events
-- ARGV[1] now (ms): released tasks are due at once
-- ARGV[2] node id
-- ARGV[3] events stream max length (approximate)
-- ARGV[4..] pairs: task id, lease token it was claimed with
--
-- Returns the number of tasks released (those still held with their token).
local released = 0
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[3], id) == ARGV[i + 1] then
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('ZADD', KEYS[1], ARGV[1], id)
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*',
      'type', 'released', 'id', id, 'node', ARGV[2], 'ts', ARGV[1])
    released = released + 1
  end
end
return released
