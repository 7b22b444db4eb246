-- frontier_push: add requests to the leased frontier, each once (its dupefilter).
--
-- KEYS[1] frontier  ZSET   request id -> score (lowest first)
-- KEYS[2] requests  HASH   request id -> request (JSON)
-- KEYS[3] scores    HASH   request id -> its score, kept while it is leased
-- KEYS[4] seen      SET    fingerprints the frontier has taken
-- KEYS[5] seq       STRING push counter (the FIFO order)
-- ARGV[1] order: 'priority' (score = -priority) or 'fifo' (score = push counter)
-- ARGV[2..] groups of 4, one per request:
--   request id, fingerprint ('' for a request that is not filtered:
--   dont_filter), -priority, request (JSON)
--
-- The fingerprint is added to seen in the same step as the request is stored,
-- so a node killed between the two cannot leave a fingerprint seen whose
-- request nobody holds.
-- Returns one integer per request, in order: 1 added; 0 its fingerprint was
-- seen already (a duplicate), in which case nothing changes for it.
local out = {}
local fifo = ARGV[1] == 'fifo'
for i = 2, #ARGV, 4 do
  local id, fp = ARGV[i], ARGV[i + 1]
  if fp ~= '' and redis.call('SADD', KEYS[4], fp) == 0 then
    out[#out + 1] = 0
  else
    local score = ARGV[i + 2]
    if fifo then
      score = redis.call('INCR', KEYS[5])
    end
    redis.call('HSET', KEYS[2], id, ARGV[i + 3])
    redis.call('HSET', KEYS[3], id, score)
    redis.call('ZADD', KEYS[1], score, id)
    out[#out + 1] = 1
  end
end
return out
