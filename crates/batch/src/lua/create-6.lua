-- create: a new batch, status `validating`, due for a steward at once, holding its lines in its
-- tenant's count of lines not yet finished. Past the tenant's bound nothing is written.
-- KEYS[1] the batch hash  KEYS[2] the tenant's batches zset  KEYS[3] the live zset
-- KEYS[4] the per-status counts hash  KEYS[5] the input file's hash
-- KEYS[6] the enqueued hash (tenant -> its batch lines not yet finished)
-- ARGV[1] batch id  ARGV[2] creation time, Unix ms (the list order)  ARGV[3] tenant
-- ARGV[4] the tenant's bound on lines not yet finished, 0 for none
-- ARGV[5..] field, value pairs of the batch
-- Returns {1, lines held} when made; {0} when the input file is gone; {-1, lines the tenant
-- has not finished, lines of this batch} when the bound refuses it (nothing written either way).
if redis.call('EXISTS', KEYS[5]) == 0 then
  return {0}
end
local lines = tonumber(redis.call('HGET', KEYS[5], 'lines')) or 0
local enqueued = tonumber(redis.call('HGET', KEYS[6], ARGV[3])) or 0
local bound = tonumber(ARGV[4]) or 0
if bound > 0 and enqueued + lines > bound then
  return {-1, enqueued, lines}
end
for i = 5, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'status', 'validating', 'held', lines)
redis.call('HINCRBY', KEYS[4], 'validating', 1)
redis.call('HINCRBY', KEYS[6], ARGV[3], lines)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], 0, ARGV[1])
redis.call('HSET', KEYS[5], 'batch', ARGV[1])
redis.call('HINCRBY', KEYS[5], 'readers', 1)
return {1, lines}
