-- quotaAcquire: takes one slot of a tenant's concurrency quota for a passthrough request, if one
-- is free: the redis-quota gate's counter and move (concurrency mode), so the front door, the
-- router's step and the processors' gates share one account per tenant. The check and the
-- increment are one step, so two replicas cannot both take the last slot.
-- KEYS[1] the counter, <prefix><attribute>:<tenant> (default quota:userid:<tenant>)
-- ARGV[1] the tenant's limit  ARGV[2] the counter's TTL, seconds (the window), set on every take
-- Returns 1 when a slot was taken (reserved; give it back with quotaRelease-1), 0 when every
-- slot is held (overflow; nothing changed).
local held = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if held >= tonumber(ARGV[1]) then
  return 0
end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
