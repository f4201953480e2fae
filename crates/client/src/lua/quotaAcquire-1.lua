--[[
  Takes one slot of a concurrency quota, if one is free (redis-quota, mode "concurrency"): the
  processors' redis-quota gate and the front door's passthrough (inferq-batch) both take it, so
  a tenant has one account. The check and the increment are one step, so two processors (or
  front doors) cannot both take the last slot.

  Input:
    KEYS[1] the quota counter, <prefix><attribute>:<value>
    ARGV[1] the limit (slots per counter)
    ARGV[2] the counter's TTL in seconds, set again on every take, so a counter whose holders
            all died without giving back expires

  Output:
    1  a slot was taken ("reserved"); give it back with quotaRelease-1
    0  every slot is held ("overflow"); nothing changed
]]
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if held >= tonumber(ARGV[1]) then
  return 0
end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
