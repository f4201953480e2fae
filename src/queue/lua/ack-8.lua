--[[ ack: claimed -> done. Publishes a generation's single terminal result and drops its claim.

  Fenced: only the current owner token may ack. Because the claim disappears in the same step the
  result is pushed, a generation reaches done at most once; a retried ack whose first reply was
  lost finds the claim gone and answers 0 without pushing anything.

  Input:
    KEYS[1] claimed      hash
    KEYS[2] claim-owners hash
    KEYS[3] claims-idx   zset
    KEYS[4] claim-scores hash
    KEYS[5] deliveries   hash  claim key -> lease expiries so far (inferq only)
    KEYS[6] result list  (consumers BRPOP it; LPUSH keeps FIFO order)
    KEYS[7] request-active:<id> (optional: omitted in Redis Cluster mode, where it is another slot)
    KEYS[8] request-cancel:<id> (optional, with KEYS[7])
    ARGV[1] claim key
    ARGV[2] owner token
    ARGV[3] result JSON (Go ResultMessage)
    ARGV[4] the generation's request token, for the guarded cleanup of KEYS[7..8]

  Output: 1 published; 0 not yours (already done, or taken over after a lease expiry)
]]
local ck = ARGV[1]
if redis.call('HGET', KEYS[2], ck) ~= ARGV[2] then
  return 0
end
dropClaim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ck)
redis.call('HDEL', KEYS[5], ck)
redis.call('LPUSH', KEYS[6], ARGV[3])
if KEYS[8] then
  forgetGeneration(KEYS[7], KEYS[8], ARGV[4])
end
return 1
