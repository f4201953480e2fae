--[[ bury: claimed -> dead. Sets a claimed generation aside (over the delivery limit, poison, or
  unusable) with a dead-letter record, and publishes its terminal result so the producer learns.

  Fenced like ack: only the current owner token may bury.

  Input:
    KEYS[1] claimed      hash
    KEYS[2] claim-owners hash
    KEYS[3] claims-idx   zset
    KEYS[4] claim-scores hash
    KEYS[5] deliveries   hash
    KEYS[6] result list
    KEYS[7] dead list    (inferq only; newest first)
    KEYS[8] request-active:<id> (optional, as for ack)
    KEYS[9] request-cancel:<id> (optional, with KEYS[8])
    ARGV[1] claim key
    ARGV[2] owner token
    ARGV[3] result JSON (Go ResultMessage with error_code DEAD_LETTERED), or "" when the member
            has no readable id (then the dead record is the only terminal record)
    ARGV[4] dead-letter record JSON (member, reason, deliveries, time)
    ARGV[5] the generation's request token, for the guarded cleanup of KEYS[8..9]

  Output: 1 buried; 0 not yours
]]
local ck = ARGV[1]
if redis.call('HGET', KEYS[2], ck) ~= ARGV[2] then
  return 0
end
dropClaim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ck)
redis.call('HDEL', KEYS[5], ck)
if ARGV[3] ~= '' then
  redis.call('LPUSH', KEYS[6], ARGV[3])
end
redis.call('LPUSH', KEYS[7], ARGV[4])
if KEYS[9] then
  forgetGeneration(KEYS[8], KEYS[9], ARGV[5])
end
return 1
