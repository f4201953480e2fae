--[[ Passthrough's quota classification (the step's acquire, the redis-quota gate's scheme):
  take a reserved slot when the tenant's counter is below its limit, refreshing the window.
  KEYS[1] <prefix><attribute>:<tenant>
  ARGV[1] the tenant's limit   ARGV[2] the window, seconds
  returns 1 (reserved: a slot taken, released when the request ends) or 0 (overflow)
]]
local current = redis.call("GET", KEYS[1])
if current and tonumber(current) >= tonumber(ARGV[1]) then
  return 0
end
redis.call("INCR", KEYS[1])
redis.call("EXPIRE", KEYS[1], ARGV[2])
return 1
