--[[ staleStaged: the results staged longer ago than a lease (by this node's TIME), for upkeep to
  settle (deliverOnce-2, then unstage-3): their finisher died or stalled between the steps of a
  finish across Redis Cluster slots. Reads only, but for index entries whose staged result is
  gone already, which it drops.

  Input:
    KEYS[1] finishing     hash  claim key -> staged result
    KEYS[2] finishing-idx zset  claim key -> when it was staged, Unix ms
    ARGV[1] how old a staged result must be, in milliseconds
    ARGV[2] how many at most

  Output: { claim key, staged result, claim key, staged result, ... }
]]
local before = nowMs() - tonumber(ARGV[1])
local cks = redis.call('ZRANGE', KEYS[2], '-inf', before, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[2]))
if #cks == 0 then
  return {}
end
local values = redis.call('HMGET', KEYS[1], unpack(cks))
local out, orphans = {}, {}
for i, ck in ipairs(cks) do
  if values[i] then
    out[#out + 1] = ck
    out[#out + 1] = values[i]
  else
    orphans[#orphans + 1] = ck
  end
end
if #orphans > 0 then
  redis.call('ZREM', KEYS[2], unpack(orphans))
end
return out
