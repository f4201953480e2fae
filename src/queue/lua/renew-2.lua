--[[ renew: extend the leases of all claims one instance holds on a queue, in one call.

  Fenced: a claim is renewed only while it still names the caller's owner token. A claim that
  was reclaimed, taken over, acked or released answers 0, and the caller must drop it and abort
  its in-flight request. A lease that ran out but was not yet reclaimed by anyone is still the
  caller's: renewing it is safe, because nobody else can hold it.

  Input:
    KEYS[1] claim-owners hash  claim key -> owner token
    KEYS[2] claims-idx   zset  claim key -> lease expiry, Unix seconds
    ARGV[1] lease in milliseconds
    ARGV[2..] pairs: claim key, owner token

  Output: { now_ms, status per claim }: 1 renewed until now + lease; 0 not yours
]]
local now = nowMs()
local expiry = (now + tonumber(ARGV[1])) / 1000
local out = { now }
for i = 2, #ARGV, 2 do
  local ck, token = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', KEYS[1], ck) == token then
    redis.call('ZADD', KEYS[2], expiry, ck)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
