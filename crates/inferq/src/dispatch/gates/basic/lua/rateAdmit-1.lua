--[[
  Admits one request into a sliding-window rate limit (redis-quota, mode "rate-limit").
  Time is Redis's own clock (TIME), so processors on hosts with skewed clocks share one window.
  Pruning, counting and recording are one step.

  Scores are Unix nanoseconds, as the Go processor writes them (ZADD key now now), so Go and
  inferq processors sharing a window count and prune each other's entries alike. Lua numbers
  are doubles, exact only up to 2^53, and a nanosecond time (about 1.7e18) is beyond that: the
  score and the cutoff are built as exact decimal strings from TIME's seconds and microseconds
  (each exact as a number), and Redis parses them itself. A zset score is a double too, so
  Redis keeps them to 256 ns at today's times (Go's float64 scores are rounded the same way):
  an entry within 256 ns of the cutoff may fall either side of it.

  Input:
    KEYS[1] the window: a sorted set with one member per admitted request, scored by its
            admission time in Unix nanoseconds
    ARGV[1] the limit (admissions per window)
    ARGV[2] the window length in nanoseconds (below 2^53, about 104 days)
    ARGV[3] the set's TTL in milliseconds (twice the window)
    ARGV[4] a nonce that makes this admission's member unique

  Output:
    1  admitted ("reserved") and recorded
    0  the window is full ("overflow"); nothing recorded
]]
local t = redis.call('TIME')
local micros = tonumber(t[2])
local window = tonumber(ARGV[2])
local windowMicros = math.floor(window / 1000)
local windowRest = window - windowMicros * 1000
-- The cutoff, now - window in nanoseconds, as whole microseconds and the nanoseconds after them.
local cutMicros = tonumber(t[1]) * 1000000 + micros - windowMicros
local cutRest = 0
if windowRest > 0 then
  cutMicros = cutMicros - 1
  cutRest = 1000 - windowRest
end
if cutMicros >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f%03d', cutMicros, cutRest))
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
local stamp = t[1] .. string.format('%06d', micros) .. '000'
redis.call('ZADD', KEYS[1], stamp, stamp .. '-' .. ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
