-- schedule: park a new retry task (the first failure of a request on this node).
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks    HASH   task id -> envelope
-- KEYS[4] events   STREAM lifecycle events
-- ARGV[1] task id
-- ARGV[2] envelope (JSON)
-- ARGV[3] due time (ms)
-- ARGV[4] now (ms)
-- ARGV[5] kind
-- ARGV[6] attempt
-- ARGV[7] node id
-- ARGV[8] url
-- ARGV[9] events stream max length (approximate)
--
-- Returns 1 when scheduled; 0 when a live task with this id exists already (one
-- live retry per request fingerprint), in which case nothing changes.
local id = ARGV[1]
if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id) then
  return 0
end
redis.call('HSET', KEYS[3], id, ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], id)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[9], '*',
  'type', 'scheduled', 'id', id, 'kind', ARGV[5], 'attempt', ARGV[6],
  'due', ARGV[3], 'node', ARGV[7], 'ts', ARGV[4], 'url', ARGV[8])
return 1
