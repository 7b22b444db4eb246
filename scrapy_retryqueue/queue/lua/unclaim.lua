-- unclaim: hand back what claims whose reply this node never got leased under their tokens.
--
-- A poll that timed out or lost its connection may have run claim.lua: its tasks
-- are leased under the poll's token, which the node knows though it never learned
-- their ids. They go back to due at once, with no reclaim counted (no node ran
-- them), instead of waiting for their leases to expire.
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] owners   HASH   task id -> lease token
-- KEYS[4] events   STREAM lifecycle events
-- ARGV[1] now (ms): the tasks are due at once
-- ARGV[2] node id
-- ARGV[3] events stream max length (approximate)
-- ARGV[4..] lease tokens of the claims whose reply was lost
--
-- Returns the ids of the tasks handed back. Reads every lease of the spider
-- (owners holds only the tasks the fleet runs now, at most its in-flight total).
local lost = {}
for i = 4, #ARGV do
  lost[ARGV[i]] = true
end
local owners = redis.call('HGETALL', KEYS[3])
local back = {}
for i = 1, #owners, 2 do
  local id, token = owners[i], owners[i + 1]
  if lost[token] then
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('ZADD', KEYS[1], ARGV[1], id)
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*',
      'type', 'released', 'id', id, 'node', ARGV[2], 'ts', ARGV[1])
    back[#back + 1] = id
  end
end
return back
