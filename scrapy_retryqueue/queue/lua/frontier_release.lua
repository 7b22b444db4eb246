-- frontier_release: a node stopping hands back the frontier requests it holds
-- and did not finish, to be leased again at once, in their order.
--
-- KEYS[1] frontier  ZSET   request id -> score (lowest first)
-- KEYS[2] leased    ZSET   request id -> lease expiry (ms)
-- KEYS[3] owners    HASH   request id -> lease token
-- KEYS[4] scores    HASH   request id -> its score in frontier
-- ARGV[1..] pairs: request id, lease token it was leased with
--
-- A request whose score is missing goes back with score 0.
-- Returns the number of requests released (those still held with their token).
local released = 0
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[3], id) == ARGV[i + 1] then
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('ZADD', KEYS[1], redis.call('HGET', KEYS[4], id) or 0, id)
    released = released + 1
  end
end
return released
