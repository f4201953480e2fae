--[[ release: claimed -> pending at the original score. Hands back claims whose work has not
  started (or was abandoned at shutdown) without waiting a whole lease, and without counting a
  delivery attempt.

  Fenced: only claims that still name the caller's token are released.

  Input:
    KEYS[1] claimed      hash
    KEYS[2] claim-owners hash
    KEYS[3] claims-idx   zset
    KEYS[4] claim-scores hash
    KEYS[5] pending      zset
    ARGV[1..] pairs: claim key, owner token

  Output: { status per claim }: 1 released; 0 not yours
]]
--- @include dropClaim
--- @include deadlineOf
--- @include writable
local out = {}
-- Before the first write, every key written must take its write (see writable).
local refused = wrongTypeOf({ 'hash', 'hash', 'zset', 'hash', 'zset' }, 5)
if refused then
  return refused
end
for i = 1, #ARGV, 2 do
  local ck, token = ARGV[i], ARGV[i + 1]
  local member = redis.call('HGET', KEYS[1], ck)
  if member and redis.call('HGET', KEYS[2], ck) == token then
    local score = storedScore(redis.call('HGET', KEYS[4], ck)) or scoreOf(member) or 0
    redis.call('ZADD', KEYS[5], score, member)
    dropClaim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ck)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
