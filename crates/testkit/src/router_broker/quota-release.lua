--[[ Passthrough's quota release: give back a reserved slot when the request ends.
  KEYS[1] <prefix><attribute>:<tenant>
  ARGV[1] the window, seconds (refreshed while slots remain)
  returns nothing
]]
local current = redis.call("GET", KEYS[1])
if current and tonumber(current) > 0 then
  local remaining = redis.call("DECR", KEYS[1])
  if remaining > 0 then
    redis.call("EXPIRE", KEYS[1], ARGV[1])
  end
end
