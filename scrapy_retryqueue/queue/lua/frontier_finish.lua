-- frontier_finish: a node leaving a crawl that is over forgets what the
-- frontier saw, so that the next crawl of the spider starts afresh, and marks
-- the crawl finished when it ran out of work (not when it was stopped).
--
-- KEYS[1] frontier  ZSET   request id -> score (frontier requests waiting)
-- KEYS[2] leased    ZSET   request id -> lease expiry (frontier requests leased)
-- KEYS[3] seen      SET    fingerprints the frontier has taken
-- KEYS[4] seq       STRING push counter (the FIFO order)
-- KEYS[5] retry_due    ZSET retry task id -> due time (retries waiting)
-- KEYS[6] retry_leased ZSET retry task id -> lease expiry (retries leased)
-- KEYS[7] nodes     HASH   node id -> "<heartbeat ms> <last busy ms> ..."
-- KEYS[8] finished  STRING "<finished ms> <node id>" of the crawl that finished
-- ARGV[1] heartbeats at or after this time (ms) are of nodes still crawling
-- ARGV[2] the mark "<now ms> <node id>" to set when the crawl is over, '' for none
--         (the node's spider closed for another reason than running out of work)
--
-- The crawl is over when nothing waits or is leased, in the frontier nor in
-- the retry queue, and no node still crawls (the caller removed its own
-- heartbeat first). Otherwise nothing changes: an interrupted crawl resumes.
-- The mark has no expiry: a node that starts later crawls nothing until one
-- starts a new crawl (frontier_join.lua) or the frontier's keys are deleted.
-- Returns 1 when the seen fingerprints were forgotten, else 0.
if redis.call('ZCARD', KEYS[1]) > 0 or redis.call('ZCARD', KEYS[2]) > 0 then
  return 0
end
if redis.call('ZCARD', KEYS[5]) > 0 or redis.call('ZCARD', KEYS[6]) > 0 then
  return 0
end
local alive_after = tonumber(ARGV[1])
for _, beat in ipairs(redis.call('HVALS', KEYS[7])) do
  local ms = tonumber(string.match(beat, '^(%d+)'))
  if ms and ms >= alive_after then
    return 0
  end
end
redis.call('DEL', KEYS[3], KEYS[4])
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[8], ARGV[2])
end
return 1
