-- cancel: ends a request of the front door `cancelled` at once, for its tenant, and announces
-- it; the processors' cancel marker (set by the caller first) stops it at its claim or in
-- flight, and the result they push later is dropped by collect. A request that has ended
-- keeps its ending.
-- KEYS[1] the request's hash  KEYS[2] where its result is stored
-- ARGV[1] the caller's tenant  ARGV[2] the CANCELLED result (a Go ResultMessage)
-- ARGV[3] the result retention, seconds  ARGV[4] the record's TTL once ended, seconds
-- ARGV[5] the channel announcing ended requests  ARGV[6] the request's id
-- ARGV[7] now, Unix seconds
-- Returns 1 cancelled now, 2 already ended, 0 no such request of this tenant.
local r = redis.call('HMGET', KEYS[1], 'tenant', 'status')
if r[1] ~= ARGV[1] then
  return 0
end
if r[2] ~= 'queued' then
  return 2
end
redis.call('HSET', KEYS[1], 'status', 'ended', 'code', 'CANCELLED', 'ended_at', ARGV[7])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
