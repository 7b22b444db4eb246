-- frontier_reap: return frontier requests whose lease expired (their node
-- died) to the frontier; quarantine poison pills.
--
-- KEYS[1] frontier   ZSET   request id -> score (lowest first)
-- KEYS[2] requests   HASH   request id -> request (JSON)
-- KEYS[3] leased     ZSET   request id -> lease expiry (ms)
-- KEYS[4] owners     HASH   request id -> lease token
-- KEYS[5] scores     HASH   request id -> its score in frontier
-- KEYS[6] reclaims   HASH   request id -> reclaim count
-- KEYS[7] quarantine HASH   request id -> "<kind> <stored text>"
-- ARGV[1] now (ms): leases that expired at or before it are reaped
-- ARGV[2] batch size
-- ARGV[3] max reclaims: a request reclaimed more often is quarantined
-- ARGV[4] kind written in the quarantine (kinds.POISON)
--
-- A lease without a request (a ghost) is dropped and reported as reclaimed.
-- Returns {{reclaimed ids}, {quarantined ids}}.
local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local reclaimed, poisoned = {}, {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  local request = redis.call('HGET', KEYS[2], id)
  local count = redis.call('HINCRBY', KEYS[6], id, 1)
  if request and count > tonumber(ARGV[3]) then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HSET', KEYS[7], id, ARGV[4] .. ' ' .. request)
    poisoned[#poisoned + 1] = id
  elseif request then
    redis.call('ZADD', KEYS[1], redis.call('HGET', KEYS[5], id) or 0, id)
    reclaimed[#reclaimed + 1] = id
  else
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    reclaimed[#reclaimed + 1] = id
  end
end
return {reclaimed, poisoned}
