-- nowMs(): Redis server time in milliseconds. Every lease in inferq is reckoned by this clock,
-- never by a processor's wall clock, so clock skew between hosts cannot move a reclaim.
local function nowMs()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
