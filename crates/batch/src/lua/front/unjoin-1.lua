-- unjoin: removes a join key while it still names the given generation: once that generation's
-- result was delivered (a repeated id is then a new request), or when its submission failed (so
-- a refused call leaves nothing behind). A newer generation's key is left alone.
-- KEYS[1] the join key, inferq-front:join:<tenant>:<id>
-- ARGV[1] the generation's token
-- Returns 1 when the key was removed, 0 when it names another generation or is gone.
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^%S+ (%S+) ') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
