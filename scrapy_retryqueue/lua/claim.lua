-- claim: lease up to a batch of due tasks to one node.
--
-- KEYS[1] due      ZSET   task id -> due time (ms)
-- KEYS[2] leased   ZSET   task id -> lease expiry (ms)
-- KEYS[3] tasks    HASH   task id -> envelope
-- KEYS[4] owners   HASH   task id -> lease token
-- KEYS[5] events   STREAM lifecycle events
-- ARGV[1] now (ms): tasks due at or before it are claimed
-- ARGV[2] batch size (0 only reports the counts)
-- ARGV[3] lease expiry (ms)
-- ARGV[4] lease token of this claim
-- ARGV[5] node id
-- ARGV[6] events stream max length (approximate)
-- KEYS[6] cooling  ZSET   domain -> end of its cooldown (ms)   (optional)
-- KEYS[7] probes   HASH   domain -> probe lease expiry (ms)   (optional)
-- ARGV[7] 1 to respect per-domain cooldowns (needs KEYS[6..7]), else 0 or absent
-- ARGV[8] ms to wait before looking again at a task of a half-open domain
--         whose probe is in flight
-- KEYS[8] dead      ZSET  task id -> time of death (ms)
-- KEYS[9] deadtasks HASH  task id -> envelope of a dead letter
-- KEYS[10] reclaims HASH  task id -> reclaim count
-- ARGV[9] longest wait (ms) of a task on cooldowns, counted from its creation;
--         0 or absent: no limit. A task that would have to wait longer is
--         dead-lettered with kind ARGV[11] instead of being moved.
-- ARGV[10] envelope version, written in the dead letter of a ghost
-- KEYS[11] taskinfo  HASH task id -> "<created ms> <host> <url>" (taskinfo.py)
-- KEYS[12] deadkinds HASH task id -> kind the dead letter died of
-- ARGV[11] kind of a task dead-lettered for waiting too long (kinds.RATE_LIMITED)
-- ARGV[12] kind of a ghost's dead letter (kinds.MALFORMED)
--
-- A ghost is a due id without an envelope in tasks (written around these
-- scripts, or its envelope lost: eviction, a partial restore). Nothing of it
-- can be retried. It leaves due and becomes a dead letter of kind ARGV[12]
-- (an envelope that says so, a 'dead' event) so that people see it; when its
-- id already has a dead letter, that one is kept as it is and the ghost is
-- only reported back.
--
-- With cooldowns (ARGV[7] = 1, and only while some domain cools down), the
-- host and creation time of each candidate task are read from taskinfo (never
-- from the envelope): a task of a cooling domain is not claimed but moved to
-- the end of the cooldown in due; once the cooldown has ended (half-open), the
-- first task claimed for the domain is its single probe (its lease expiry is
-- stored in probes) and the others wait ARGV[8] ms more, until the probe
-- reopens the domain or fails. A task without taskinfo (written by an older
-- version) has no host, so no cooldown holds it; one without a creation time
-- has no longest wait.
--
-- Returns {due count, leased count, next due time (ms) or -1, {ghost ids
-- dead-lettered}, {ghost ids whose dead letter was kept}, id1, envelope1,
-- id2, envelope2, ...}; counts and next due time are taken after the claim.
-- Envelopes are returned as stored: the caller decodes each on its own, so
-- one that is not UTF-8 text harms no other task of the batch.
-- One 'claimed' event covers the whole batch: its 'ids' field lists the task
-- ids, separated by spaces (an event per task cost a third of the throughput).
local out = {0, 0, -1, {}, {}}
local ids = {}
if tonumber(ARGV[2]) > 0 then
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
end
local envelopes = {}
if #ids > 0 then
  -- One command per structure for the whole batch, not one per task.
  envelopes = redis.call('HMGET', KEYS[3], unpack(ids))
  if tonumber(ARGV[7] or '0') == 1 and redis.call('ZCARD', KEYS[6]) > 0 then
    local now = tonumber(ARGV[1])
    local infos = redis.call('HMGET', KEYS[11], unpack(ids))
    local kept, kept_envelopes, deferred = {}, {}, {}
    for i, id in ipairs(ids) do
      local envelope = envelopes[i]
      -- "<created ms> <host> <url>": created and host may be empty.
      local created, host, url
      if envelope and infos[i] then
        created, host, url = string.match(infos[i], '^(%d*) (%S*) (.*)$')
      end
      local cool = host and host ~= '' and redis.call('ZSCORE', KEYS[6], host)
      local later = nil
      if cool then
        cool = tonumber(cool)
        if cool > now then
          later = cool
        else
          local probe = redis.call('HGET', KEYS[7], host)
          if probe and tonumber(probe) > now then
            later = now + tonumber(ARGV[8])
          else
            redis.call('HSET', KEYS[7], host, ARGV[3])
          end
        end
      end
      local max_wait = tonumber(ARGV[9] or '0')
      local since = later and max_wait > 0 and tonumber(created)
      if since and later - since > max_wait then
        redis.call('ZREM', KEYS[1], id)
        redis.call('HDEL', KEYS[3], id)
        redis.call('HDEL', KEYS[10], id)
        redis.call('HDEL', KEYS[11], id)
        redis.call('ZADD', KEYS[8], ARGV[1], id)
        redis.call('HSET', KEYS[9], id, envelope)
        redis.call('HSET', KEYS[12], id, ARGV[11])
        redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*',
          'type', 'dead', 'id', id, 'kind', ARGV[11], 'node', ARGV[5], 'ts', ARGV[1],
          'url', url)
      elseif later then
        deferred[#deferred + 1] = later
        deferred[#deferred + 1] = id
      else
        kept[#kept + 1] = id
        kept_envelopes[#kept_envelopes + 1] = envelope or false
      end
    end
    if #deferred > 0 then
      redis.call('ZADD', KEYS[1], unpack(deferred))
    end
    ids, envelopes = kept, kept_envelopes
  end
end
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  local leases, owners = {}, {}
  local ghosts, kept_dead = out[4], out[5]
  for i, id in ipairs(ids) do
    local envelope = envelopes[i]
    if envelope then
      leases[#leases + 1] = ARGV[3]
      leases[#leases + 1] = id
      owners[#owners + 1] = id
      owners[#owners + 1] = ARGV[4]
      out[#out + 1] = id
      out[#out + 1] = envelope
    elseif redis.call('ZSCORE', KEYS[8], id) then
      -- Never overwrite a real dead letter with the note of a ghost.
      kept_dead[#kept_dead + 1] = id
    else
      local now = tonumber(ARGV[1])
      local why = {kind = ARGV[12], type = 'MissingEnvelope',
        message = 'task id was in the due set without an envelope in the tasks hash'}
      redis.call('HDEL', KEYS[10], id)
      redis.call('HDEL', KEYS[11], id)
      redis.call('ZADD', KEYS[8], ARGV[1], id)
      -- Encoded, not parsed: a new document, written once.
      redis.call('HSET', KEYS[9], id, cjson.encode({
        v = tonumber(ARGV[10]), id = id, kind = ARGV[12], dead_kind = ARGV[12],
        node = ARGV[5], created = now, updated = now, due = now,
        first_error = why, last_error = why}))
      redis.call('HSET', KEYS[12], id, ARGV[12])
      redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*',
        'type', 'dead', 'id', id, 'kind', ARGV[12], 'node', ARGV[5], 'ts', ARGV[1],
        'url', '')
      ghosts[#ghosts + 1] = id
    end
  end
  if #leases > 0 then
    redis.call('ZADD', KEYS[2], unpack(leases))
    redis.call('HSET', KEYS[4], unpack(owners))
    local claimed = {}
    for i = 2, #owners, 2 do
      claimed[#claimed + 1] = owners[i - 1]
    end
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*',
      'type', 'claimed', 'ids', table.concat(claimed, ' '), 'node', ARGV[5], 'ts', ARGV[1])
  end
end
out[1] = redis.call('ZCARD', KEYS[1])
out[2] = redis.call('ZCARD', KEYS[2])
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  out[3] = tonumber(first[2])
end
return out
