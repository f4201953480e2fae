-- dropClaim(claimed, owners, idx, scores, ck): removes every trace of claim `ck` from the claim
-- bookkeeping (member, owner token, lease expiry, original score). Callers have already checked
-- the fence and place the member somewhere else in the same script.
local function dropClaim(claimed, owners, idx, scores, ck)
  redis.call('HDEL', claimed, ck)
  redis.call('HDEL', owners, ck)
  redis.call('ZREM', idx, ck)
  redis.call('HDEL', scores, ck)
end
