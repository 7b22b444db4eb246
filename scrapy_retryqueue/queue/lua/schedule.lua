-- schedule: park new retry tasks (first failures of requests on this node).
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks    HASH   task id -> envelope
-- KEYS[4] events   STREAM lifecycle events
-- KEYS[5] taskinfo HASH   task id -> "<created ms> <host> <url>" (what claim reads)
-- KEYS[6] versions HASH   task id -> version (the envelope's updated ms) of the live task
-- ARGV[1] node id
-- ARGV[2] events stream max length (approximate)
-- ARGV[3..] groups of 10, one per task:
--   task id, envelope (JSON), due time (ms), now (ms), kind, attempt, url,
--   task info (the taskinfo value, made by Python: taskinfo.py),
--   version ('' with signing off: the record is removed), event's signature ('' with signing off)
--
-- Returns one integer per task, in order: 1 when scheduled; 0 when a live task
-- with its id exists already (one live retry per request fingerprint), in
-- which case nothing changes for it.
local out = {}
for i = 3, #ARGV, 10 do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id) then
    out[#out + 1] = 0
  else
    redis.call('HSET', KEYS[3], id, ARGV[i + 1])
    redis.call('HSET', KEYS[5], id, ARGV[i + 7])
    if ARGV[i + 8] ~= '' then
      redis.call('HSET', KEYS[6], id, ARGV[i + 8])
    else
      redis.call('HDEL', KEYS[6], id)
    end
    redis.call('ZADD', KEYS[1], ARGV[i + 2], id)
    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*',
      'type', 'scheduled', 'id', id, 'kind', ARGV[i + 4], 'attempt', ARGV[i + 5],
      'due', ARGV[i + 2], 'node', ARGV[1], 'ts', ARGV[i + 3], 'url', ARGV[i + 6],
      'sig', ARGV[i + 9])
    out[#out + 1] = 1
  end
end
return out
