-- adopt: move a spider's queue from the layout before namespaces to its project's.
--
-- Both layouts of a spider share its hash tag ({spider}), so all of these keys are
-- in one Redis Cluster slot. Nothing moves when the project's queue has any key
-- already: that queue is in use, and the old one is left for a person to look at.
--
-- KEYS[1..] 2n keys: the spider's n keys without a namespace (retryqueue:{spider}:<name>),
--            then the same n keys in the project's namespace, in the same order
-- ARGV[1] n, the number of keys of one layout
--
-- Returns the number of keys moved (0: nothing to adopt), or -1 when there is
-- an old queue but the project's exists already (nothing moved).
local n = tonumber(ARGV[1])
local old = 0
for i = 1, n do
  old = old + redis.call('EXISTS', KEYS[i])
end
if old == 0 then
  return 0
end
for i = n + 1, 2 * n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return -1
  end
end
local moved = 0
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[n + i])
    moved = moved + 1
  end
end
return moved
