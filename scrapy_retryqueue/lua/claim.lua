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
-- One 'claimed' event covers the whole batch: its 'ids' field lists the task
-- ids, separated by spaces (an event per task cost a third of the throughput).
local out = {0, 0, -1}
local ids = {}
if tonumber(ARGV[2]) > 0 then
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
end
if #ids > 0 then
  -- One command per structure for the whole batch, not one per task.
  redis.call('ZREM', KEYS[1], unpack(ids))
  local envelopes = redis.call('HMGET', KEYS[3], unpack(ids))
  local leases, owners = {}, {}
  for i, id in ipairs(ids) do
    local envelope = envelopes[i]
    if envelope then
      leases[#leases + 1] = ARGV[3]
      leases[#leases + 1] = id
      owners[#owners + 1] = id
      owners[#owners + 1] = ARGV[4]
      out[#out + 1] = id
      out[#out + 1] = envelope
    end
  end
  if #leases > 0 then
    redis.call('ZADD', KEYS[2], unpack(leases))
    redis.call('HSET', KEYS[4], unpack(owners))
    local claimed = {}
    for i = 2, #owners, 2 do
      claimed[#claimed + 1] = owners[i - 1]
    end
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*',
      'type', 'claimed', 'ids', table.concat(claimed, ' '), 'node', ARGV[5], 'ts', ARGV[1])
  end
end
out[1] = redis.call('ZCARD', KEYS[1])
out[2] = redis.call('ZCARD', KEYS[2])
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  out[3] = tonumber(first[2])
end
return out
