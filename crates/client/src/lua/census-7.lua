#!lua flags=no-writes
--[[ census: how many of a queue's requests are in each place of the durability contract, read
  in one step so that no request is counted twice or missed while it moves (`inferq status`).
  Moves nothing; flagged no-writes, so it also runs on a read-only replica.

  Input:
    KEYS[1] pending       zset  member -> deadline, Unix seconds
    KEYS[2] claimed       hash  claim key -> member
    KEYS[3] claims-idx    zset  claim key -> lease expiry, Unix seconds
    KEYS[4] parked        zset  member -> due time, Unix seconds
    KEYS[5] dead          list  dead-letter records
    KEYS[6] deliveries    hash  claim key -> lease expiries so far
    KEYS[7] result list   list  (optional) where the queue's results are pushed
    ARGV: none

  Output: { Redis time in ms, pending, pending whose deadline passed, claimed, claims whose lease
  ran out (not yet reclaimed), parked, parked whose backoff elapsed, dead, unfinished requests
  whose lease ran out at least once (delivered again), results waiting in KEYS[7] (-1 without it) }, or a WRONGTYPE error
  when a key holds another type.
]]
local t = redis.call('TIME')
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = nowMs / 1000
local results = -1
if #KEYS >= 7 then
  results = redis.call('LLEN', KEYS[7])
end
return {
  nowMs,
  redis.call('ZCARD', KEYS[1]),
  -- As the worker and reclaim reckon them: a deadline or a lease at now has passed.
  redis.call('ZCOUNT', KEYS[1], '-inf', now),
  redis.call('HLEN', KEYS[2]),
  redis.call('ZCOUNT', KEYS[3], '-inf', now),
  redis.call('ZCARD', KEYS[4]),
  redis.call('ZCOUNT', KEYS[4], '-inf', now),
  redis.call('LLEN', KEYS[5]),
  redis.call('HLEN', KEYS[6]),
  results,
}
