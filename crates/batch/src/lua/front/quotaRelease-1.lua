-- quotaRelease: gives back the slot quotaAcquire-1 took, when the passthrough request ends
-- (answered, failed or abandoned). Never below zero: a counter that expired meanwhile is left.
-- KEYS[1] the counter, <prefix><attribute>:<tenant>
-- ARGV[1] the counter's TTL, seconds, set again while slots are still held
-- Returns the number of slots still held.
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if held <= 0 then
  return 0
end
local left = redis.call('DECR', KEYS[1])
if left > 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return left
