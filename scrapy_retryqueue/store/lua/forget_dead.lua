-- forget_dead: drop dead letters from Redis once the SQL store holds them, and
-- acknowledge the events of the batch that stored them, in one call.
--
-- KEYS[1] dead      ZSET   task id -> time of death (ms)
-- KEYS[2] deadtasks HASH   task id -> envelope of the dead letter
-- KEYS[3] events    STREAM lifecycle events (only read when entries are acknowledged)
-- KEYS[4] deadkinds HASH   task id -> kind the dead letter died of
-- ARGV[1] consumer group of the store writers ('' when nothing is acknowledged)
-- ARGV[2] n: how many (task id, time of death) pairs follow
-- ARGV[3 .. 2 + 2n] pairs: task id, time of death (ms) of the death the store wrote
-- ARGV[3 + 2n ..] ids of stream entries to acknowledge in ARGV[1]
--
-- A dead letter is removed only while its time of death still equals the one
-- stored, so a later death of the same id (not yet stored) stays in Redis.
-- One call instead of two round trips per batch (the removal, then XACK).
-- Returns {dead letters removed, entries acknowledged}.
local removed = 0
local pairs_end = 2 + 2 * tonumber(ARGV[2])
for i = 3, pairs_end, 2 do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[4], id)
    removed = removed + 1
  end
end
local acked = 0
if ARGV[1] ~= '' then
  -- In slices: unpack() of a very long list overflows Lua's stack.
  local slice = {}
  for i = pairs_end + 1, #ARGV do
    slice[#slice + 1] = ARGV[i]
    if #slice == 500 or i == #ARGV then
      acked = acked + redis.call('XACK', KEYS[3], ARGV[1], unpack(slice))
      slice = {}
    end
  end
end
return {removed, acked}
