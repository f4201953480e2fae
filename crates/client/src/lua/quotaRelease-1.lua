--[[
  Gives back one slot of a concurrency quota taken by quotaAcquire-1 (when the gate's request
  or the front door's passthrough answer ends).
  Never goes below zero (a counter that expired meanwhile is left alone).

  Input:
    KEYS[1] the quota counter, <prefix><attribute>:<value>
    ARGV[1] the counter's TTL in seconds, set again while slots are still held

  Output:
    the number of slots still held
]]
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if held <= 0 then
  return 0
end
local left = redis.call('DECR', KEYS[1])
if left > 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return left
