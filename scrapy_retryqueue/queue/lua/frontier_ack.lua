-- frontier_ack: frontier requests a node finished (callback run and its output
-- handed on, or its failure parked or dead-lettered): they leave the frontier.
--
-- KEYS[1] requests  HASH   request id -> request (JSON)
-- KEYS[2] leased    ZSET   request id -> lease expiry (ms)
-- KEYS[3] owners    HASH   request id -> lease token
-- KEYS[4] scores    HASH   request id -> its score in frontier
-- KEYS[5] reclaims  HASH   request id -> reclaim count
-- ARGV[1..] pairs: request id, lease token it was leased with
--
-- Its fingerprint stays in seen: the request is done, not to be fetched again.
-- Returns the ids whose lease the node no longer held (reaped and perhaps
-- leased by another node): nothing changes for those.
local lost = {}
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[3], id) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
  else
    lost[#lost + 1] = id
  end
end
return lost
