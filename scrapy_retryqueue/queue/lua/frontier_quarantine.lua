-- frontier_quarantine: take leased frontier requests that cannot be read out
-- of the frontier, kept as they were stored for a person to look at.
--
-- KEYS[1] requests   HASH   request id -> request (JSON)
-- KEYS[2] leased     ZSET   request id -> lease expiry (ms)
-- KEYS[3] owners     HASH   request id -> lease token
-- KEYS[4] scores     HASH   request id -> its score in frontier
-- KEYS[5] reclaims   HASH   request id -> reclaim count
-- KEYS[6] quarantine HASH   request id -> "<kind> <stored text>"
-- ARGV[1] kind written in the quarantine (kinds.MALFORMED)
-- ARGV[2..] pairs: request id, lease token it was leased with
--
-- Returns the number of requests quarantined (those still held with their token).
local moved = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[3], id) == ARGV[i + 1] then
    local request = redis.call('HGET', KEYS[1], id) or ''
    redis.call('HSET', KEYS[6], id, ARGV[1] .. ' ' .. request)
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    moved = moved + 1
  end
end
return moved
