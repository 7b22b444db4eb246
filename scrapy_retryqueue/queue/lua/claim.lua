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
-- KEYS[13] budget   HASH domain -> retry budget record (retrybudget.py)   (optional)
-- KEYS[14] versions HASH task id -> version (updated ms) of the live task's envelope
-- KEYS[15] finished ZSET task id -> version of the envelope its task last finished with
-- ARGV[13] 1 to return the replay records of each task claimed (RETRYQUEUE_SIGNING_KEYS),
--          else 0
-- ARGV[14] retry budget share of a domain's fresh requests; 0 or absent: no budget
-- ARGV[15] retries a domain may get per window whatever its requests (floor x window)
-- ARGV[16] length of one slice of the budget's window (ms)
-- ARGV[17] slices a record holds (BUDGET_SLICES + 1)
-- ARGV[18..] domain, count pairs: the fresh requests this node sent to each
--            domain since its last poll, added to the domain's record first
--
-- With a retry budget (ARGV[14] > 0), a task is claimed only while its domain's
-- retries of the record's slices, with it, stay within ARGV[15] + ARGV[14] x the
-- requests of its newest slices but two (retrybudget.py says why). One over budget
-- is moved to the start of the next slice in due: deferred, not dropped, its
-- envelope untouched (no attempt used), never dead-lettered for its wait. A record
-- that does not read as this script writes it (a hostile writer) is started over
-- and its domain returned. Records of this slice length only: one of another
-- (the window changed) starts over silently.
--
-- A ghost is a due id without an envelope in tasks (written around these
-- scripts, or its envelope lost: eviction, a partial restore). Nothing of it
-- can be retried. It leaves due and becomes a dead letter of kind ARGV[12]
-- (an envelope that says so, a 'dead' event) so that people see it; when its
-- id already has a dead letter, that one is kept as it is and the ghost is
-- only reported back.
--
-- With cooldowns (ARGV[7] = 1, and only while some domain cools down) or a
-- retry budget, the host and creation time of each candidate task are read
-- from taskinfo (never from the envelope): a task of a cooling domain is not claimed but moved to
-- the end of the cooldown in due; once the cooldown has ended (half-open), the
-- first task claimed for the domain is its single probe (its lease expiry is
-- stored in probes) and the others wait ARGV[8] ms more, until the probe
-- reopens the domain or fails. A task without taskinfo (written by an older
-- version) has no host, so no cooldown holds it; one without a creation time
-- has no longest wait.
--
-- A task dead-lettered here (a ghost, one that waited too long) leaves its
-- version record; one that waited too long is recorded as finished with it.
--
-- Returns {due count, leased count, next due time (ms) or -1, {ghost ids
-- dead-lettered}, {ghost ids whose dead letter was kept}, {domain, tasks the
-- budget deferred, ...}, {domains whose budget record was malformed}, {version1,
-- finished1, version2, finished2, ...} (with ARGV[13] = 1: each claimed task's
-- version and finished records, '' when it has none; else empty), id1,
-- envelope1, id2, envelope2, ...}; counts and next due time are taken after the claim.
-- Envelopes are returned as stored: the caller decodes each on its own, so
-- one that is not UTF-8 text harms no other task of the batch.
-- One 'claimed' event covers the whole batch: its 'ids' field lists the task
-- ids, separated by spaces (an event per task cost a third of the throughput).
-- record_finished() is lua/lib/finished.lua, prepended to this file when the script is loaded.

local out = {0, 0, -1, {}, {}, {}, {}, {}}
local records = tonumber(ARGV[13] or '0') == 1
local now = tonumber(ARGV[1])

-- The retry budget (retrybudget.py): records loaded once per call, written at the end.
local share = tonumber(ARGV[14] or '0') or 0
local budget_on = share > 0
local budgets, budget_order = {}, {}
local slots, slice, index, floor_total = 0, 1, 0, 0
if budget_on then
  floor_total = tonumber(ARGV[15])
  slice = tonumber(ARGV[16])
  slots = tonumber(ARGV[17])
  index = math.floor(now / slice)
end
local function record(host)
  local rec = budgets[host]
  if rec then return rec end
  rec = {q = {}, r = {}, at = index}
  for i = 1, slots do rec.q[i] = 0 rec.r[i] = 0 end
  local raw = redis.call('HGET', KEYS[13], host)
  if raw then
    local nums, ok = {}, #raw <= 512
    if ok then
      for tok in string.gmatch(raw, '%S+') do
        if #tok > 15 or not string.match(tok, '^%d+$') then ok = false break end
        nums[#nums + 1] = tonumber(tok)
      end
    end
    local shift = ok and #nums == 2 + 2 * slots and index - nums[2]
    if not shift or shift < -slots then
      -- Not a record this script wrote, or one from far ahead: started over.
      local bad = out[7]
      bad[#bad + 1] = host
    elseif nums[1] == slice then
      -- A record a little ahead (another node's clock) counts on in its own newest slice.
      if shift < 0 then shift, rec.at = 0, nums[2] end
      for i = 1, slots - shift do
        rec.q[i] = nums[2 + i + shift]
        rec.r[i] = nums[2 + slots + i + shift]
      end
    end
  end
  budgets[host] = rec
  budget_order[#budget_order + 1] = host
  return rec
end
local function allowance(rec)
  local q, r = 0, 0
  for i = 3, slots do q = q + rec.q[i] end
  for i = 1, slots do r = r + rec.r[i] end
  return math.floor(floor_total + share * q) - r
end
if budget_on then
  for i = 18, #ARGV - 1, 2 do
    local host, count = ARGV[i], tonumber(ARGV[i + 1])
    if host ~= '' and count and count > 0 then
      local rec = record(host)
      rec.q[slots] = rec.q[slots] + count
    end
  end
end

local ids = {}
if tonumber(ARGV[2]) > 0 then
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
end
local envelopes = {}
if #ids > 0 then
  -- One command per structure for the whole batch, not one per task.
  envelopes = redis.call('HMGET', KEYS[3], unpack(ids))
  local cooldowns = tonumber(ARGV[7] or '0') == 1 and redis.call('ZCARD', KEYS[6]) > 0
  if cooldowns or budget_on then
    local infos = redis.call('HMGET', KEYS[11], unpack(ids))
    local kept, kept_envelopes, deferred, over = {}, {}, {}, {}
    local next_slice = (index + 1) * slice
    for i, id in ipairs(ids) do
      local envelope = envelopes[i]
      -- "<created ms> <host> <url>": created and host may be empty.
      local created, host, url
      if envelope and infos[i] then
        created, host, url = string.match(infos[i], '^(%d*) (%S*) (.*)$')
      end
      local later, probe_for, budgeted = nil, nil, false
      local cool = cooldowns and host and host ~= '' and redis.call('ZSCORE', KEYS[6], host)
      if cool then
        cool = tonumber(cool)
        if cool > now then
          later = cool
        else
          local probe = redis.call('HGET', KEYS[7], host)
          if probe and tonumber(probe) > now then
            later = now + tonumber(ARGV[8])
          else
            probe_for = host
          end
        end
      end
      if not later and budget_on and host and host ~= '' then
        local rec = record(host)
        if allowance(rec) > 0 then
          rec.r[slots] = rec.r[slots] + 1
        else
          later, budgeted = next_slice, true
          over[host] = (over[host] or 0) + 1
        end
      end
      if probe_for and not later then
        redis.call('HSET', KEYS[7], probe_for, ARGV[3])
      end
      local max_wait = tonumber(ARGV[9] or '0')
      local since = later and not budgeted and max_wait > 0 and tonumber(created)
      if since and later - since > max_wait then
        redis.call('ZREM', KEYS[1], id)
        redis.call('HDEL', KEYS[3], id)
        redis.call('HDEL', KEYS[10], id)
        redis.call('HDEL', KEYS[11], id)
        record_finished(KEYS[15], id, redis.call('HGET', KEYS[14], id) or '', ARGV[1])
        redis.call('HDEL', KEYS[14], id)
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
    local told = out[6]
    for _, host in ipairs(budget_order) do
      if over[host] then
        told[#told + 1] = host
        told[#told + 1] = over[host]
      end
    end
    ids, envelopes = kept, kept_envelopes
  end
end
if budget_on then
  for _, host in ipairs(budget_order) do
    local rec, used = budgets[host], 0
    local text = {string.format('%d', slice), string.format('%d', rec.at)}
    for i = 1, slots do
      text[#text + 1] = string.format('%d', rec.q[i])
      used = used + rec.q[i]
    end
    for i = 1, slots do
      text[#text + 1] = string.format('%d', rec.r[i])
      used = used + rec.r[i]
    end
    if used > 0 then
      redis.call('HSET', KEYS[13], host, table.concat(text, ' '))
    else
      redis.call('HDEL', KEYS[13], host)
    end
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
      if records then
        local held = out[8]
        held[#held + 1] = redis.call('HGET', KEYS[14], id) or ''
        held[#held + 1] = redis.call('ZSCORE', KEYS[15], id) or ''
      end
    elseif redis.call('ZSCORE', KEYS[8], id) then
      -- Never overwrite a real dead letter with the note of a ghost.
      kept_dead[#kept_dead + 1] = id
    else
      local why = {kind = ARGV[12], type = 'MissingEnvelope',
        message = 'task id was in the due set without an envelope in the tasks hash'}
      redis.call('HDEL', KEYS[10], id)
      redis.call('HDEL', KEYS[11], id)
      redis.call('HDEL', KEYS[14], id)
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
