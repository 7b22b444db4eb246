-- frontier_lease: lease a batch of frontier requests to one node, best first.
--
-- KEYS[1] frontier  ZSET   request id -> score (lowest first)
-- KEYS[2] requests  HASH   request id -> request (JSON)
-- KEYS[3] leased    ZSET   request id -> lease expiry (ms)
-- KEYS[4] owners    HASH   request id -> lease token
-- KEYS[5] scores    HASH   request id -> its score in frontier
-- ARGV[1] batch size (0 only reports the counts)
-- ARGV[2] lease expiry (ms)
-- ARGV[3] lease token of this lease
--
-- A ghost (an id in frontier without a request: written around these
-- scripts, or its request lost) leaves frontier and is reported back.
-- Returns {waiting count, leased count, {ghost ids}, id1, request1, id2,
-- request2, ...}; the counts are taken after the lease. Requests are returned
-- as stored: the caller decodes each on its own.
local out = {0, 0, {}}
local limit = tonumber(ARGV[1])
if limit > 0 then
  local ids = redis.call('ZRANGE', KEYS[1], 0, limit - 1)
  if #ids > 0 then
    redis.call('ZREM', KEYS[1], unpack(ids))
    local requests = redis.call('HMGET', KEYS[2], unpack(ids))
    local leases, owners = {}, {}
    for i, id in ipairs(ids) do
      if requests[i] then
        leases[#leases + 1] = ARGV[2]
        leases[#leases + 1] = id
        owners[#owners + 1] = id
        owners[#owners + 1] = ARGV[3]
        out[#out + 1] = id
        out[#out + 1] = requests[i]
      else
        redis.call('HDEL', KEYS[5], id)
        out[3][#out[3] + 1] = id
      end
    end
    if #leases > 0 then
      redis.call('ZADD', KEYS[3], unpack(leases))
      redis.call('HSET', KEYS[4], unpack(owners))
    end
  end
end
out[1] = redis.call('ZCARD', KEYS[1])
out[2] = redis.call('ZCARD', KEYS[3])
return out
