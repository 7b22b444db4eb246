-- retry_now: make waiting tasks due at once (a person asked for it, e.g. from
-- the dashboard).
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] tasks    HASH   task id -> envelope
-- KEYS[3] events   STREAM lifecycle events
-- ARGV[1] node id (of the dashboard or command that asks)
-- ARGV[2] events stream max length (approximate)
-- ARGV[3] now (ms): the new due time
-- ARGV[4..] task ids
--
-- Only tasks in the due set change (a leased task is being retried already).
-- Each one changed gets a 'scheduled' event (with 'manual' = 'retry_now', due =
-- now) so the store shows it due now. Its envelope is not rewritten.
-- Returns one integer per task id, in order: 1 made due now; 0 not waiting.
local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], id) and redis.call('HEXISTS', KEYS[2], id) == 1 then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[3], id)
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*',
      'type', 'scheduled', 'id', id, 'due', ARGV[3], 'node', ARGV[1], 'ts', ARGV[3],
      'manual', 'retry_now')
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
