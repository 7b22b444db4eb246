-- finished: the replay record of a task that leaves the live set (RETRYQUEUE_SIGNING_KEYS),
-- shared by ack.lua, deadletter.lua, cancel.lua, reap.lua and claim.lua. It is no script
-- of its own: queue.load_script_source prepends this file to each of those (wire.SNIPPETS).
--
-- Has no KEYS or ARGV of its own: the one key it touches, finished, is the caller's,
-- passed in from the caller's KEYS and listed in the caller's header. The caller
-- forgets the task's version record (versions) itself.
--
-- record_finished(finished, id, stamp, now)
--   finished   ZSET task id -> version (updated ms) of the envelope its task last
--              finished with
--   stamp      the version to record; '' records none (signing off, or an entry
--              that never was the crawl's: a forged or malformed one)
--   now        the caller's time (ms): no record is later than it, so that a value
--              written around the scripts cannot refuse the task's later lives
--
-- Returns nothing.
local function record_finished(finished, id, stamp, now)
  local at = tonumber(stamp)
  if at then
    redis.call('ZADD', finished, math.min(at, tonumber(now)), id)
  end
end

