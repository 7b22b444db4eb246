-- finishedtrim: keeps the replay records of finished tasks bounded (RETRYQUEUE_REPLAY_WINDOW,
-- RETRYQUEUE_REPLAY_RECORDS), shared by ack.lua and deadletter.lua, which add the most
-- of them. It is no script of its own: queue.load_script_source prepends this file to
-- each of those (wire.SNIPPETS).
--
-- Has no KEYS or ARGV of its own: the one key it touches, finished, is the caller's,
-- passed in from the caller's KEYS and listed in the caller's header.
--
-- trim_finished(finished, now, keep, most)
--   finished   ZSET task id -> version of the envelope its task last finished with
--   now        the caller's time (ms)
--   keep       ms a record is kept (0: records are off, nothing to trim)
--   most       the most records kept: the oldest beyond it go first
--
-- Returns nothing.
local function trim_finished(finished, now, keep, most)
  keep = tonumber(keep)
  if keep and keep > 0 then
    local oldest = string.format('%d', tonumber(now) - keep)
    redis.call('ZREMRANGEBYSCORE', finished, '-inf', '(' .. oldest)
    redis.call('ZREMRANGEBYRANK', finished, 0, -(tonumber(most) + 1))
  end
end

