-- claim: lease up to a batch of due tasks to one node.
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks    HASH   task id -> envelope
-- KEYS[4] owners   HASH   task id -> lease token
-- KEYS[5] events   STREAM lifecycle events
-- ARGV[1] now (ms): tasks due at or before it are claimed
-- ARGV[2] batch size (0 only reports the counts)
-- ARGV[3] lease expiry (ms)
-- ARGV[4] lease token of this claim
-- ARGV[5] node id
-- ARGV[6] events stream max length (approximate)
--
-- Returns {due count, leased count, next due time (ms) or -1, id1, envelope1,
-- id2, envelope2, ...}; counts and next due time are taken after the claim.
local ids = {}
if tonumber(ARGV[2]) > 0 then
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
end
local out = {0, 0, -1}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local envelope = redis.call('HGET', KEYS[3], id)
  if envelope then
    redis.call('ZADD', KEYS[2], ARGV[3], id)
    redis.call('HSET', KEYS[4], id, ARGV[4])
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*',
      'type', 'claimed', 'id', id, 'node', ARGV[5], 'ts', ARGV[1])
    out[#out + 1] = id
    out[#out + 1] = envelope
  end
end
out[1] = redis.call('ZCARD', KEYS[1])
out[2] = redis.call('ZCARD', KEYS[2])
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  out[3] = tonumber(first[2])
end
return out
