--[[ park: claimed -> parked. Schedules a retry: the claim is dropped and the request, rewritten by
  the caller with its bumped retry_count, waits in the parked set until its backoff has elapsed.

  Fenced: only the current owner token may park. One step, so a crash can neither duplicate the
  request nor strand it (Go's "ZADD a copy, then renew the claim" could do both).

  Input:
    KEYS[1] claimed      hash
    KEYS[2] claim-owners hash
    KEYS[3] claims-idx   zset
    KEYS[4] claim-scores hash
    KEYS[5] parked       zset  member -> due time, Unix seconds (inferq only)
    ARGV[1] claim key
    ARGV[2] owner token
    ARGV[3] the member to park (same generation, retry_count bumped)
    ARGV[4] backoff in milliseconds, counted from Redis TIME

  Output: due time in ms when parked; 0 not yours
]]
local ck = ARGV[1]
if redis.call('HGET', KEYS[2], ck) ~= ARGV[2] then
  return 0
end
local due = nowMs() + tonumber(ARGV[4])
dropClaim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ck)
redis.call('ZADD', KEYS[5], due / 1000, ARGV[3])
return due
