--[[ take: pending -> claimed, for a batch of members a consumer peeked (and, on a gated queue,
  admitted), checking each one's cancel marker in the same step. One call per poll; every Redis
  command inside is variadic, so a batch costs a constant number of commands however big it is.

  Each member that is still pending is removed from the queue and held under a fresh owner token
  with a lease that expires lease_ms from now (Redis TIME). Nothing is copied: the member leaves
  pending in the same step it enters claimed. A cancelled member is claimed too (status 2): its
  owner then publishes CANCELLED through the fenced ack, so it still gets exactly one record.

  Input:
    KEYS[1] pending      zset  member -> score (deadline)
    KEYS[2] claimed      hash  claim key -> member          (Go durable-claims name)
    KEYS[3] claim-owners hash  claim key -> owner token     (Go durable-claims name)
    KEYS[4] claims-idx   zset  claim key -> lease expiry, Unix seconds (Go durable-claims name)
    KEYS[5] claim-scores hash  claim key -> original score  (inferq only)
    KEYS[6..] request-cancel:<id> of the members that carry a request token (Go producer keys)
    ARGV[1] lease in milliseconds
    ARGV[2..] per member 5 fields: member, claim key (id NUL request_token), fresh owner token,
              index into KEYS of its cancel marker (0: none; -1: the caller read the marker
              itself and found this generation cancelled, as on a Redis Cluster, where the
              markers live in other slots), its request token

  Output: { now_ms, status per member }, status:
     2  claimed by this token, and the producer has cancelled this generation
     1  claimed by this token
     0  gone: no longer pending (another instance claimed it, or it was removed)
    -1  duplicate: this generation is already claimed; the stray pending copy is removed so the
        generation can reach done only once
]]
--- @include nowMs
--- @include writable
local W = 5
local n = (#ARGV - 1) / W
local out = { nowMs() }
if n < 1 then
  return out
end
local expiry = (out[1] + tonumber(ARGV[1])) / 1000
local members, cks = {}, {}
for i = 1, n do
  local b = 1 + (i - 1) * W
  members[i] = ARGV[b + 1]
  cks[i] = ARGV[b + 2]
end
local scores = redis.call('ZMSCORE', KEYS[1], unpack(members))
local held = redis.call('HMGET', KEYS[2], unpack(cks))
local markers = {}
if #KEYS > 5 then
  local cancelKeys = {}
  for k = 6, #KEYS do
    cancelKeys[#cancelKeys + 1] = KEYS[k]
  end
  local values = redis.call('MGET', unpack(cancelKeys))
  for k = 6, #KEYS do
    markers[k] = values[k - 5]
  end
end
local removed, claimed, owners, idx, origin = {}, {}, {}, {}, {}
local seenMember, seenClaim = {}, {}
for i = 1, n do
  local b = 1 + (i - 1) * W
  local member, ck, token = members[i], cks[i], ARGV[b + 3]
  local cancelAt, requestToken = tonumber(ARGV[b + 4]), ARGV[b + 5]
  local score = scores[i]
  if not score or seenMember[member] then
    out[#out + 1] = 0
  elseif held[i] or seenClaim[ck] then
    removed[#removed + 1] = member
    out[#out + 1] = -1
  else
    removed[#removed + 1] = member
    claimed[#claimed + 1] = ck
    claimed[#claimed + 1] = member
    owners[#owners + 1] = ck
    owners[#owners + 1] = token
    idx[#idx + 1] = expiry
    idx[#idx + 1] = ck
    origin[#origin + 1] = ck
    origin[#origin + 1] = score
    seenClaim[ck] = true
    if cancelAt < 0 or (cancelAt > 0 and requestToken ~= '' and markers[cancelAt] == requestToken) then
      out[#out + 1] = 2
    else
      out[#out + 1] = 1
    end
  end
  if score then
    seenMember[member] = true
  end
end
-- Before the first write: the claim bookkeeping must take its writes (see writable); pending
-- and claimed were read above, so they hold their types.
if #claimed > 0 then
  local refused = wrongTypeOf({ false, false, 'hash', 'zset', 'hash' }, 5)
  if refused then
    return refused
  end
end
if #removed > 0 then
  redis.call('ZREM', KEYS[1], unpack(removed))
end
if #claimed > 0 then
  redis.call('HSET', KEYS[2], unpack(claimed))
  redis.call('HSET', KEYS[3], unpack(owners))
  redis.call('ZADD', KEYS[4], unpack(idx))
  redis.call('HSET', KEYS[5], unpack(origin))
end
return out
