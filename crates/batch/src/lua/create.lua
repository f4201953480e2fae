-- create: a new batch, status `validating`, due for a steward at once.
-- KEYS[1] the batch hash  KEYS[2] the tenant's batches zset  KEYS[3] the live zset
-- KEYS[4] the per-status counts hash  KEYS[5] the input file's hash
-- ARGV[1] batch id  ARGV[2] creation time, Unix ms (the list order)
-- ARGV[3..] field, value pairs of the batch
-- Returns 1, or 0 when the input file is gone (nothing written).
if redis.call('EXISTS', KEYS[5]) == 0 then
  return 0
end
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'status', 'validating')
redis.call('HINCRBY', KEYS[4], 'validating', 1)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], 0, ARGV[1])
redis.call('HSET', KEYS[5], 'batch', ARGV[1])
return 1
