-- forget_dead: drop dead letters from Redis once the SQL store holds them.
--
-- KEYS[1] dead      ZSET   task id -> time of death (ms)
-- KEYS[2] deadtasks HASH   task id -> envelope of the dead letter
-- ARGV[1..] pairs: task id, time of death (ms) of the death the store wrote
--
-- A dead letter is removed only while its time of death still equals the one
-- stored, so a later death of the same id (not yet stored) stays in Redis.
-- Returns the number of dead letters removed.
local removed = 0
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    removed = removed + 1
  end
end
return removed
