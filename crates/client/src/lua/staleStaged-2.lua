--[[ staleStaged: the results staged longer ago than a lease (by this node's TIME), for upkeep to
  settle (deliverOnce-2, then unstage-3): their finisher died or stalled between the steps of a
  finish across Redis Cluster slots; and what deliverOnce-2 needs to trim markers safely: this
  node's time and the oldest staged result. Reads only, but for index entries whose staged
  result is gone already, which it drops. With ARGV[2] = 0 it reads the times alone (a finisher
  about to deliver what it staged).

  Input:
    KEYS[1] finishing     hash  claim key -> staged result
    KEYS[2] finishing-idx zset  claim key -> when it was staged, Unix ms
    ARGV[1] how old a staged result must be, in milliseconds
    ARGV[2] how many at most

  Output: { now (Unix ms), oldest staged (Unix ms) or "", claim key, staged result, ... }
]]
--- @include nowMs
local now = nowMs()
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local out = { tostring(now), first[2] or '' }
if tonumber(ARGV[2]) < 1 then
  return out
end
local cks = redis.call('ZRANGE', KEYS[2], '-inf', now - tonumber(ARGV[1]), 'BYSCORE', 'LIMIT', 0,
  tonumber(ARGV[2]))
if #cks == 0 then
  return out
end
local values = redis.call('HMGET', KEYS[1], unpack(cks))
local orphans = {}
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
