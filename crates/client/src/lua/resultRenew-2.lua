--[[ resultRenew (durable result consumers, Go's RenewResult): extend one claim's lease.

  Fenced: only the claim's owner renews it, and only while its lease lives (by Redis TIME). A
  lease that ran out may already be put back by a receive, so it is not revived: the caller has
  lost the result and must not ack it.

  Input:
    KEYS[1] <route>:result-claim-owners  hash claim ID -> owner token
    KEYS[2] <route>:result-claims-idx    zset claim ID -> lease expiry, Unix ms
    ARGV[1] claim ID
    ARGV[2] owner token
    ARGV[3] lease, ms
  Output: 1 renewed until now + lease; 0 ownership lost (another owner, no claim, or expired)
]]
--- @include nowMs
local now = nowMs()
local owner = redis.call('HGET', KEYS[1], ARGV[1])
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
if ARGV[2] == '' or owner ~= ARGV[2] or not expiry or tonumber(expiry) <= now then
  return 0
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
return 1
