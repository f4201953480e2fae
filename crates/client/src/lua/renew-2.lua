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
  Three variadic commands (HMGET, ZREM, ZADD) per call, however many claims it renews.

  Out of memory (maxmemory reached with noeviction): Redis refuses a script's first write when
  that write may grow memory (ZADD may), and lets every later write through, since a script
  cannot be stopped half done. A renewal only moves expiries of entries that exist, so it must
  work then, or every lease runs out under its live owner and its work is aborted: the renewed
  entries are removed (ZREM, never refused) and added back with their new expiry, in one step.
]]
--- @include nowMs
local now = nowMs()
local expiry = (now + tonumber(ARGV[1])) / 1000
local out = { now }
local cks = {}
for i = 2, #ARGV, 2 do
  cks[#cks + 1] = ARGV[i]
end
if #cks == 0 then
  return out
end
local owners = redis.call('HMGET', KEYS[1], unpack(cks))
local renewed = {}
for j, ck in ipairs(cks) do
  if owners[j] == ARGV[2 * j + 1] then
    renewed[#renewed + 1] = expiry
    renewed[#renewed + 1] = ck
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
if #renewed > 0 then
  local members = {}
  for k = 2, #renewed, 2 do
    members[#members + 1] = renewed[k]
  end
  redis.call('ZREM', KEYS[2], unpack(members))
  redis.call('ZADD', KEYS[2], unpack(renewed))
end
return out
