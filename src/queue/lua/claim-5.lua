--[[ claim: pending -> claimed, for a batch of members a consumer peeked and admitted.

  Each member that is still pending is removed from the queue and held under a fresh owner token
  with a lease that expires lease_ms from now (Redis TIME). Nothing is copied: the member leaves
  pending in the same step it enters claimed.

  Input:
    KEYS[1] pending      zset  member -> score (deadline)
    KEYS[2] claimed      hash  claim key -> member          (Go durable-claims name)
    KEYS[3] claim-owners hash  claim key -> owner token     (Go durable-claims name)
    KEYS[4] claims-idx   zset  claim key -> lease expiry, Unix seconds (Go durable-claims name)
    KEYS[5] claim-scores hash  claim key -> original score  (inferq only)
    ARGV[1] lease in milliseconds
    ARGV[2..] triples: member, claim key (id NUL request_token), fresh owner token

  Output: { now_ms, status per member }, status:
     1  claimed by this token
     0  gone: no longer pending (another instance claimed it, or it was removed)
    -1  duplicate: this generation is already claimed; the stray pending copy is removed so the
        generation can reach done only once
]]
local now = nowMs()
local expiry = (now + tonumber(ARGV[1])) / 1000
local out = { now }
for i = 2, #ARGV, 3 do
  local member, ck, token = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local score = redis.call('ZSCORE', KEYS[1], member)
  if not score then
    out[#out + 1] = 0
  elseif redis.call('HEXISTS', KEYS[2], ck) == 1 then
    redis.call('ZREM', KEYS[1], member)
    out[#out + 1] = -1
  else
    redis.call('ZREM', KEYS[1], member)
    redis.call('HSET', KEYS[2], ck, member)
    redis.call('HSET', KEYS[3], ck, token)
    redis.call('ZADD', KEYS[4], expiry, ck)
    redis.call('HSET', KEYS[5], ck, score)
    out[#out + 1] = 1
  end
end
return out
