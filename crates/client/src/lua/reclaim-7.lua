--[[ reclaim: expired claims -> pending (or taken over to be finished), in a bounded batch.

  Any instance runs this periodically. A claim whose lease expired by Redis TIME has lost its
  owner (crash, partition, pause). Each one counts a delivery attempt, then:
    - its deadline has passed         -> taken over by the caller (fresh token, fresh lease), who
                                         acks it with DEADLINE_EXCEEDED;
    - deliveries reached max          -> taken over by the caller, who buries it (dead letter +
                                         terminal record), so a poison request cannot crash-loop
                                         every replica;
    - otherwise                       -> back to pending at its original score.
  A claim-index entry without a claimed member (left by an older writer) is removed.
  Taking over is itself a fenced claim: if the caller dies before finishing, the new lease
  expires and the next reclaim does the same again.

  Every delivery count is indexed by its generation's deadline (KEYS[7]), and each call drops up
  to ARGV[1] counts whose deadline has passed. finish drops a count when its generation is acked
  or buried, but a generation can also leave pending without a finish (its producer ZREMs it);
  past its deadline a count decides nothing (an expired claim is finished as DEADLINE_EXCEEDED
  whatever its count), so dropping it then keeps the hash from growing with such generations.
  Counts written without an entry (by a release before this index) are given one by adoptCounts.

  Input:
    KEYS[1] claimed      hash
    KEYS[2] claim-owners hash
    KEYS[3] claims-idx   zset
    KEYS[4] claim-scores hash
    KEYS[5] deliveries   hash  claim key -> lease expiries so far
    KEYS[6] pending      zset
    KEYS[7] deliveries-idx zset claim key -> the generation's deadline, Unix seconds
    ARGV[1] batch limit (of expired claims, and of passed delivery counts dropped)
    ARGV[2] max deliveries
    ARGV[3] lease in ms for taken-over claims
    ARGV[4..] fresh owner tokens, one per possible take-over (at least ARGV[1] of them)

  Output: { requeued, ms until the earliest remaining lease expires (-1: no claims), then per
            taken-over claim 5 fields:
            claim key, member, owner token, reason ("deadline" | "deliveries"), deliveries }
]]
--- @include nowMs
--- @include dropClaim
--- @include deadlineOf
--- @include writable
local now = nowMs()
local nowS = now / 1000
local maxDeliveries = tonumber(ARGV[2])
local expiry = (now + tonumber(ARGV[3])) / 1000
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', nowS, 'LIMIT', 0, tonumber(ARGV[1]))
local out = { 0, -1 }
local nextToken = 4
-- Before the first write, every key written must take its write (see writable).
if #expired > 0 then
  local refused = wrongTypeOf({ 'hash', 'hash', 'zset', 'hash', 'hash', 'zset', 'zset' }, 7)
  if refused then
    return refused
  end
end
for _, ck in ipairs(expired) do
  local member = redis.call('HGET', KEYS[1], ck)
  if not member then
    redis.call('ZREM', KEYS[3], ck)
    redis.call('HDEL', KEYS[2], ck)
    redis.call('HDEL', KEYS[4], ck)
  else
    -- The lease entry goes first (re-added below on a take-over): a ZREM is never refused for
    -- memory, and once a script has written, Redis lets its later writes through, so reclaim
    -- works while Redis is out of memory (the move does not grow it).
    redis.call('ZREM', KEYS[3], ck)
    -- Counted with HGET and HSET, not HINCRBY: a count that is not a whole number from 0 to
    -- 2^53 (written by hand or by another program; nan, inf) counts as 0 instead of failing
    -- here, after the ZREM, which would leave the claim with no lease for any reclaim to find.
    local counted = tonumber(redis.call('HGET', KEYS[5], ck))
    if not counted or counted ~= counted or counted < 0 or counted >= 2 ^ 53 then
      counted = 0
    end
    local deliveries = math.floor(counted) + 1
    redis.call('HSET', KEYS[5], ck, deliveries)
    local deadline = deadlineOf(member)
    -- A member without a readable deadline is dead-lettered once pending: its count goes at the
    -- next call.
    redis.call('ZADD', KEYS[7], deadline or 0, ck)
    local reason = nil
    if deadline and deadline <= nowS then
      reason = 'deadline'
    elseif deliveries >= maxDeliveries then
      reason = 'deliveries'
    end
    if reason then
      local token = ARGV[nextToken]
      nextToken = nextToken + 1
      redis.call('HSET', KEYS[2], ck, token)
      redis.call('ZADD', KEYS[3], expiry, ck)
      out[#out + 1] = ck
      out[#out + 1] = member
      out[#out + 1] = token
      out[#out + 1] = reason
      out[#out + 1] = deliveries
    else
      local score = storedScore(redis.call('HGET', KEYS[4], ck)) or scoreOf(member) or 0
      redis.call('ZADD', KEYS[6], score, member)
      dropClaim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ck)
      out[1] = out[1] + 1
    end
  end
end
-- Delivery counts of generations whose deadline has passed (see the header). Reads before any
-- write, and removals only, so this works on a full Redis too.
local passed = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', nowS, 'LIMIT', 0, tonumber(ARGV[1]))
if #passed > 0 then
  redis.call('HDEL', KEYS[5], unpack(passed))
  redis.call('ZREM', KEYS[7], unpack(passed))
end
local earliest = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if earliest[2] then
  out[2] = math.max(0, math.floor(tonumber(earliest[2]) * 1000 - now))
end
return out
