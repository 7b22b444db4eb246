-- frontier_join: a node starting on the leased frontier joins the fleet's crawl,
-- unless that crawl finished (frontier_finish.lua marked it): then it crawls nothing.
--
-- KEYS[1] finished  STRING "<finished ms> <node id>" of the crawl that finished
-- KEYS[2] nodes     HASH   node id -> "<heartbeat ms> <last busy ms> <registered ms>"
-- ARGV[1] node id
-- ARGV[2] its heartbeat, "<now> <now> <now>": registered, busy, about to seed
-- ARGV[3] '1' to start a new crawl after one that finished before ARGV[4], else '0'
-- ARGV[4] when this node started (ms): a crawl that finished after it is the one
--         this node was started for, which it came too late to (never restarted)
--
-- A node that joins writes its heartbeat in the same step, so a node finishing the
-- crawl at that instant sees it crawling and leaves the crawl open: the check and
-- the finish are atomic either way. A restart deletes the mark and joins.
-- Returns {0, ''} joined; {1, mark} refused (the crawl finished); {2, mark}
-- joined a new crawl, the mark of the finished one deleted.
local mark = redis.call('GET', KEYS[1])
local state = 0
if mark then
  local finished = tonumber(string.match(mark, '^(%d+)')) or 0
  if ARGV[3] ~= '1' or finished >= tonumber(ARGV[4]) then
    return {1, mark}
  end
  redis.call('DEL', KEYS[1])
  state = 2
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return {state, mark or ''}
