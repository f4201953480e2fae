--[[
  Admits one request into a sliding-window rate limit (redis-quota, mode "rate-limit").
  Time is Redis's own clock (TIME, in microseconds), so processors on hosts with skewed clocks
  share one window. Pruning, counting and recording are one step.

  Input:
    KEYS[1] the window: a sorted set with one member per admitted request, scored by its
            admission time in microseconds
    ARGV[1] the limit (admissions per window)
    ARGV[2] the window length in microseconds
    ARGV[3] the set's TTL in milliseconds (twice the window)
    ARGV[4] a nonce that makes this admission's member unique

  Output:
    1  admitted ("reserved") and recorded
    0  the window is full ("overflow"); nothing recorded
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - tonumber(ARGV[2])))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
local stamp = string.format('%.0f', now)
redis.call('ZADD', KEYS[1], stamp, stamp .. '-' .. ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
