--[[ deadLetter: pending -> dead, for a member that cannot be a request (does not decode, lacks an
  id or a deadline, absurdly large). It is set aside with the reason, never silently dropped, and
  when an id could be read the producer gets an INVALID_REQUEST result.

  Input:
    KEYS[1] pending     zset
    KEYS[2] dead list
    KEYS[3] result list (used only when ARGV[3] is not empty and ARGV[4] is not "stage")
    KEYS[4] finishing     hash (ARGV[4] "stage" only: a Redis Cluster whose result list is in
            another slot; see finish-11)
    KEYS[5] finishing-idx zset (the same)
    ARGV[1] the member, byte for byte
    ARGV[2] dead-letter record JSON (member, reason, time)
    ARGV[3] result JSON, or "" when no id could be read
    ARGV[4] "publish" to PUBLISH the result on the channel named KEYS[3] (redis-pubsub; kept in
            the list of that name when no subscriber hears it or Redis refuses the PUBLISH),
            "" to LPUSH it, "stage" to stage it under ARGV[5] in KEYS[4] for deliverOnce-2
    ARGV[5] the claim key the result is staged under ("stage" only)
    ARGV[6] the result list's TTL in seconds, set by EXPIRE after the push (Go's
            result_ttl_seconds), or 0 for none (a push only)

  Output: 1 moved; 0 the member was no longer pending (another instance moved it); -1 nothing
    moved: the result list holds another type than a list (the caller sets the member aside
    without the result). A dead list of the wrong type is an error before anything is written.
]]
--- @include nowMs
--- @include writable
--- @include deliver
if not writable(KEYS[2], 'list') then
  return wrongType(KEYS[2], 'list')
end
local stage = ARGV[4] == 'stage'
if stage then
  local refused = wrongTypeOf({ false, false, false, 'hash', 'zset' }, 5)
  if refused then
    return refused
  end
elseif ARGV[3] ~= '' and not writable(KEYS[3], 'list') then
  return -1
end
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('LPUSH', KEYS[2], ARGV[2])
if ARGV[3] ~= '' and stage then
  redis.call('HSET', KEYS[4], ARGV[5], ARGV[3])
  redis.call('ZADD', KEYS[5], nowMs(), ARGV[5])
elseif ARGV[3] ~= '' then
  deliver(KEYS[3], { ARGV[3] }, ARGV[4] == 'publish')
  local ttl = tonumber(ARGV[6]) or 0
  if ttl > 0 and ARGV[4] ~= 'publish' then
    redis.call('EXPIRE', KEYS[3], ttl)
  end
end
return 1
