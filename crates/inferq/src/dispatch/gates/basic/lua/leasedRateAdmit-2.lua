--[[
  Admits one request under a leased, pool-wide admission rate (redis-leased-rate), or, with
  ARGV[4] = 0, only reports the lease. A controller writes the lease into the control hash;
  every processor replica shares one token bucket in the state hash, so their admissions add
  up to at most the leased rate. Time is Redis's own clock (TIME), in milliseconds.

  Fails closed: a missing or empty field, another api_version or pool, a rate that is not a
  finite number >= 0, a valid_until that is not a whole number of milliseconds in the future,
  or a burst that is not a finite number > 0 admits nothing and reports the lease invalid.
  A valid lease of rate 0 is a pause: nothing is admitted, the lease is reported valid.

  The bucket holds at most max(1, rate x burst) tokens, starts full, and refills at `rate`
  tokens a second from its last use; a Redis clock that went back is taken as standing still,
  so no interval is refilled twice. The state hash expires a second after the lease ends (at
  least a second from now), so a bucket outlives its lease by at most that second.

  Input:
    KEYS[1] the control hash: api_version, pool_id, max_admission_rps, valid_until_unix_ms,
            decision_id (all required)
    KEYS[2] the state hash: tokens, last_ms
    ARGV[1] the api_version the gate speaks (llm-d.ai/v1alpha1)
    ARGV[2] the gate's pool id, which the lease must name
    ARGV[3] the burst, in seconds of the rate
    ARGV[4] 1 to take a token, 0 to read the lease only (the bucket is neither read nor written)

  Output: {admitted, lease_valid, rate, valid_until_ms}
    admitted        1 a token was taken (or, reading only, the lease allows a rate above 0);
                    0 nothing admitted
    lease_valid     1 the lease is valid now; 0 it is missing, malformed, for another pool or
                    version, or expired
    rate            the leased rate as text ("0" when the lease is invalid)
    valid_until_ms  when the lease ends, Unix milliseconds (0 when invalid)
]]
local invalid = {0, 0, '0', 0}
local lease = redis.call('HMGET', KEYS[1],
  'api_version', 'pool_id', 'max_admission_rps', 'valid_until_unix_ms', 'decision_id')
for i = 1, 5 do
  if not lease[i] or lease[i] == '' then
    return invalid
  end
end
if lease[1] ~= ARGV[1] or lease[2] ~= ARGV[2] then
  return invalid
end

-- tonumber takes "nan" and "inf" (C's strtod), so finiteness is checked as well.
local function finite(x)
  return x ~= nil and x == x and x ~= math.huge and x ~= -math.huge
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(lease[3])
local untilMs = tonumber(lease[4])
local burst = tonumber(ARGV[3])
if not finite(rate) or rate < 0 then
  return invalid
end
if not finite(untilMs) or untilMs % 1 ~= 0 or untilMs <= now then
  return invalid
end
if not finite(burst) or burst <= 0 then
  return invalid
end
local shown = string.format('%.17g', rate)
if rate == 0 then
  return {0, 1, '0', untilMs}
end
if ARGV[4] ~= '1' then
  return {1, 1, shown, untilMs}
end

local capacity = rate * burst
if not finite(capacity) then
  return invalid
end
capacity = math.max(1, capacity)
local state = redis.call('HMGET', KEYS[2], 'tokens', 'last_ms')
local tokens = tonumber(state[1])
local last = tonumber(state[2])
local at = now
if not finite(tokens) or not finite(last) then
  tokens = capacity
else
  if at < last then
    at = last
  end
  tokens = math.min(capacity, math.max(0, tokens) + (at - last) / 1000 * rate)
end
local admitted = 0
if tokens >= 1 then
  tokens = tokens - 1
  admitted = 1
end
redis.call('HSET', KEYS[2], 'tokens', string.format('%.17g', tokens), 'last_ms',
  string.format('%.0f', at))
-- Capped at about 30,000 years, so a lease set "forever" is still a TTL Redis takes.
local ttl = math.min(1e15, math.max(1000, untilMs - now + 1000))
redis.call('PEXPIRE', KEYS[2], string.format('%.0f', ttl))
return {admitted, 1, shown, untilMs}
