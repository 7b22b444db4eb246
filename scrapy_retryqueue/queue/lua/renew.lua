-- renew: extend the leases a node still holds.
--
-- KEYS[1] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[2] owners   HASH   task id -> lease token
-- ARGV[1] new lease expiry (ms)
-- ARGV[2..] pairs: task id, lease token it was claimed with
--
-- Returns the ids whose lease the node no longer holds (reaped and perhaps
-- claimed by another node); the others are renewed.
local lost = {}
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[2], id) == ARGV[i + 1] and redis.call('ZSCORE', KEYS[1], id) then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], id)
  else
    lost[#lost + 1] = id
  end
end
return lost
