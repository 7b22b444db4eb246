-- reap: return expired leases to the due set; dead-letter poison pills.
--
-- KEYS[1] due       ZSET   task id -> due time (ms)
-- KEYS[2] leased    ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks     HASH   task id -> envelope
-- KEYS[4] owners    HASH   task id -> lease token
-- KEYS[5] reclaims  HASH   task id -> reclaim count
-- KEYS[6] dead      ZSET   task id -> time of death (ms)
-- KEYS[7] deadtasks HASH   task id -> envelope of the dead letter
-- KEYS[8] events    STREAM lifecycle events
-- KEYS[9] taskinfo  HASH   task id -> "<created ms> <host> <url>" of live tasks
-- KEYS[10] deadkinds HASH  task id -> kind the dead letter died of
-- KEYS[11] versions HASH   task id -> version (updated ms) of the live task's envelope
-- KEYS[12] finished ZSET   task id -> version of the envelope its task last finished with
-- ARGV[1] now (ms): leases that expired at or before it are reaped
-- ARGV[2] batch size
-- ARGV[3] max reclaims: a task reclaimed more often is dead-lettered
-- ARGV[4] events stream max length (approximate)
-- ARGV[5] node id of the reaper (recorded on its events)
-- ARGV[6] kind of such a dead letter (kinds.POISON)
--
-- A poisoned task's envelope is kept as it is; the kind it died of goes to
-- deadkinds (no script edits an envelope's JSON text).
-- A lease without an envelope (a ghost) goes back to due without an event or
-- a count: the claim that finds it there reports it.
--
-- A poisoned task's finished record is the version recorded beside it (none
-- with signing off).
--
-- Returns {{reclaimed ids}, {poisoned ids}}.

-- record_finished() is lua/lib/finished.lua, prepended to this file when the script is loaded.

local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local reclaimed, poisoned = {}, {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[4], id)
  local envelope = redis.call('HGET', KEYS[3], id)
  if envelope then
    local count = redis.call('HINCRBY', KEYS[5], id, 1)
    if count > tonumber(ARGV[3]) then
      redis.call('HDEL', KEYS[3], id)
      redis.call('HDEL', KEYS[5], id)
      redis.call('HDEL', KEYS[9], id)
      record_finished(KEYS[12], id, redis.call('HGET', KEYS[11], id) or '', ARGV[1])
      redis.call('HDEL', KEYS[11], id)
      redis.call('ZADD', KEYS[6], ARGV[1], id)
      redis.call('HSET', KEYS[7], id, envelope)
      redis.call('HSET', KEYS[10], id, ARGV[6])
      redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[4], '*',
        'type', 'dead', 'id', id, 'kind', ARGV[6], 'reclaims', count, 'node', ARGV[5],
        'ts', ARGV[1])
      poisoned[#poisoned + 1] = id
    else
      redis.call('ZADD', KEYS[1], ARGV[1], id)
      redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[4], '*',
        'type', 'reclaimed', 'id', id, 'reclaims', count, 'node', ARGV[5], 'ts', ARGV[1])
      reclaimed[#reclaimed + 1] = id
    end
  else
    -- A leased id without an envelope (a ghost): back to due, where the next
    -- claim reports it and keeps it as a malformed dead letter (claim.lua).
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[9], id)
    redis.call('HDEL', KEYS[11], id)
    redis.call('ZADD', KEYS[1], ARGV[1], id)
  end
end
return {reclaimed, poisoned}
