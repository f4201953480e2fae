--[[ unstage: the last step of a finish across Redis Cluster slots, run in the queue's slot once
  deliverOnce-2 has pushed a staged result (or cannot: its list refuses it). The staged result is
  dropped; one that could not be pushed is set aside in the dead list with the record the caller
  wrote (which keeps the result), so it is neither lost nor pushed again.

  Input:
    KEYS[1] finishing     hash  claim key -> staged result
    KEYS[2] finishing-idx zset  claim key -> when it was staged, Unix ms
    KEYS[3] dead list           (newest first)
    ARGV pairs: claim key, dead-letter record JSON or "" (pushed: nothing to set aside)

  Output: how many staged results were dropped (one already dropped by another caller counts 0
    and writes nothing).
]]
local cks = {}
for i = 1, #ARGV, 2 do
  cks[#cks + 1] = ARGV[i]
end
if #cks == 0 then
  return 0
end
local held = redis.call('HMGET', KEYS[1], unpack(cks))
local gone, dead, seen = {}, {}, {}
for j, ck in ipairs(cks) do
  if held[j] and not seen[ck] then
    seen[ck] = true
    gone[#gone + 1] = ck
    local record = ARGV[2 * j]
    if record ~= '' then
      dead[#dead + 1] = record
    end
  end
end
if #gone == 0 then
  return 0
end
redis.call('HDEL', KEYS[1], unpack(gone))
redis.call('ZREM', KEYS[2], unpack(gone))
if #dead > 0 then
  redis.call('LPUSH', KEYS[3], unpack(dead))
end
return #gone
