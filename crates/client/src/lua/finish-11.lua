--[[ finish: the ends of many claims in one call. Each item is one of
    ack     claimed -> done    push the terminal result, drop the claim
    bury    claimed -> dead    push the result (when there is one) and a dead-letter record
    park    claimed -> parked  due after a backoff counted from Redis TIME, retry_count bumped
    release claimed -> pending at the original score, no delivery counted

  Every item is fenced on its own: it moves only while the claim still names the caller's owner
  token; otherwise it changes nothing and answers 0. Because the claim disappears in the same step
  the result is pushed, a generation reaches done at most once; a retried call whose first reply
  was lost finds the claims gone and answers 0 for them. An item repeating a claim key earlier in
  the same call answers 0 too, as it would in a second call. Every Redis command inside is
  variadic, so a batch costs a constant number of commands however many items it carries.

  Input:
    KEYS[1] claimed      hash
    KEYS[2] claim-owners hash
    KEYS[3] claims-idx   zset
    KEYS[4] claim-scores hash
    KEYS[5] deliveries   hash  claim key -> lease expiries so far (inferq only)
    KEYS[6] pending      zset  (release)
    KEYS[7] parked       zset  member -> due time, Unix seconds (park; inferq only)
    KEYS[8] dead list    (bury; inferq only, newest first)
    KEYS[9] deliveries-idx zset claim key -> deadline of each delivery count (inferq only; see
            reclaim), whose entries of acked and buried generations go with their counts
    KEYS[10] finishing    hash  claim key -> staged result (cluster only; see below)
    KEYS[11] finishing-idx zset claim key -> when it was staged, Unix ms (cluster only)
    KEYS[12..] result lists (consumers BRPOP them; LPUSH keeps FIFO order), then the producer's
            request-active:<id> / request-cancel:<id> pairs of acked and buried generations,
            and the payload keys of acked ones
    ARGV: per item 10 fields:
      kind      "ack" | "bury" | "park" | "release"
      claim key
      owner token
      ack, bury: index into KEYS of the result list, negated when the result is published on
                 the channel of that name instead (redis-pubsub; see deliver), or 0 to stage the
                 result instead of pushing it (a Redis Cluster whose result list is in another
                 slot: the result goes to KEYS[10] under the claim key, in this same step, and
                 the caller pushes it with deliverOnce-2 and drops it with unstage-3; upkeep
                 finishes any staged result its finisher left); park: the member to park (same
                 generation, retry_count bumped); release: ""
      ack: result JSON (Go ResultMessage), or what to stage; bury: the same, or "" when the
           member has no readable id; park: backoff in milliseconds; release: ""
      bury: dead-letter record JSON; otherwise ""
      ack, bury: index into KEYS of request-active:<id> (request-cancel:<id> follows it), or 0
      ack, bury: the generation's request token: the two keys are deleted only where they still
           hold it, so an old generation finishing never clears a newer one's (ID reuse)
      ack, bury: the result list's TTL in seconds, set by EXPIRE after every push to it (Go's
           per-queue result_ttl_seconds; the last pushed item's TTL wins), or 0 for none
      ack: index into KEYS of the generation's payload key (newer Go's request-payload:<id>:
           <token>, where its body was stored apart from the member), deleted when the item
           moves, or 0 (no payload key; a bury keeps it until its TTL, for a requeue)

  Output: { status per item }: 1 moved; 0 not yours (already done, taken over, or repeated);
    -2 refused: its result list holds another type than a list (nothing of it was moved);
    or, for a result to PUBLISH, the text of Redis's refusal of the PUBLISH (an ACL user without
    the channel; nothing of it was moved). Results are PUBLISHed before any write that changes
    something, each of an item that moves, so a refusal leaves its item where it was.
    A queue key of the wrong type is an error before anything is written.
]]
--- @include nowMs
--- @include deadlineOf
--- @include writable
--- @include deliver
local W = 10
local n = #ARGV / W
local out = {}
if n < 1 then
  return out
end
local cks = {}
for i = 1, n do
  cks[i] = ARGV[(i - 1) * W + 2]
end
local owners = redis.call('HMGET', KEYS[2], unpack(cks))

-- Before the first write, every key written must take its write (see writable): the queue's
-- own keys, or nothing moves; a result list, or its items are refused alone. The owners hash
-- (KEYS[2]) was just read, so it holds its type.
local kinds = { 'hash', false, 'zset', 'hash', 'hash' }
local used = {}
for i = 1, n do
  used[ARGV[(i - 1) * W + 1]] = true
end
if used.release then kinds[6] = 'zset' end
if used.park then kinds[7] = 'zset' end
if used.bury then kinds[8] = 'list' end
if used.ack or used.bury then kinds[9] = 'zset' end
local staging = false
for i = 1, n do
  local b = (i - 1) * W
  local kind = ARGV[b + 1]
  if (kind == 'ack' or kind == 'bury') and ARGV[b + 4] == '0' and ARGV[b + 5] ~= '' then
    staging = true
  end
end
if staging then
  kinds[10] = 'hash'
  kinds[11] = 'zset'
end
local refused = wrongTypeOf(kinds, 11)
if refused then
  return refused
end
local unwritable = {}
local publishing = false
for i = 1, n do
  local b = (i - 1) * W
  local kind = ARGV[b + 1]
  if (kind == 'ack' or kind == 'bury') and ARGV[b + 5] ~= '' and ARGV[b + 4] ~= '0' then
    local listAt = tonumber(ARGV[b + 4])
    if unwritable[listAt] == nil then
      unwritable[listAt] = not writable(KEYS[math.abs(listAt)], 'list')
    end
    publishing = publishing or listAt < 0
  end
end
-- Redis decides at a script's first write whether it takes writes at all (a read-only replica,
-- a failed background save, too few replicas). PUBLISH is no write, so before the first result
-- goes out, a write that changes nothing asks: a refusal then fails the call before anything was
-- published, instead of after, when the call would be retried and publish again.
if publishing then
  redis.call('ZREM', KEYS[3], '')
end

-- Releases need the member and its original score.
local releaseAt, releaseCks = {}, {}
for i = 1, n do
  if ARGV[(i - 1) * W + 1] == 'release' and owners[i] == ARGV[(i - 1) * W + 3] then
    releaseAt[#releaseAt + 1] = i
    releaseCks[#releaseCks + 1] = cks[i]
  end
end
local releaseMember, releaseScore = {}, {}
if #releaseCks > 0 then
  local members = redis.call('HMGET', KEYS[1], unpack(releaseCks))
  local scores = redis.call('HMGET', KEYS[4], unpack(releaseCks))
  for j, i in ipairs(releaseAt) do
    releaseMember[i] = members[j]
    releaseScore[i] = scores[j]
  end
end

local now = nil
local drop, finished, pushes, pushOrder, dead, parked, pending, forget = {}, {}, {}, {}, {}, {}, {}, {}
local staged, stagedAt = {}, {}
local seen = {}
local ttls = {}
local payloads = {}
local function push(listAt, value, ttl)
  if not pushes[listAt] then
    pushes[listAt] = {}
    pushOrder[#pushOrder + 1] = listAt
  end
  local list = pushes[listAt]
  list[#list + 1] = value
  ttls[listAt] = ttl
end
for i = 1, n do
  local b = (i - 1) * W
  local kind, ck, token = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local ok = not seen[ck] and owners[i] == token
  if ok and kind == 'release' and not releaseMember[i] then
    ok = false
  end
  local listAt = tonumber(ARGV[b + 4])
  local result = (kind == 'ack' or kind == 'bury') and ARGV[b + 5] ~= '' and ARGV[b + 5]
  local heard = nil
  if ok and result and not unwritable[listAt] and listAt < 0 then
    heard = announce(KEYS[-listAt], result)
  end
  if not ok then
    out[i] = 0
  elseif result and unwritable[listAt] then
    out[i] = -2
  elseif type(heard) == 'string' then
    out[i] = heard
  else
    seen[ck] = true
    drop[#drop + 1] = ck
    if kind == 'ack' or kind == 'bury' then
      finished[#finished + 1] = ck
      -- A published result that no subscriber heard is kept on the list of its channel.
      if result and listAt == 0 then
        now = now or nowMs()
        staged[#staged + 1] = ck
        staged[#staged + 1] = result
        stagedAt[#stagedAt + 1] = now
        stagedAt[#stagedAt + 1] = ck
      elseif result and heard ~= true then
        push(listAt, result, tonumber(ARGV[b + 9]) or 0)
      end
      if kind == 'bury' then
        dead[#dead + 1] = ARGV[b + 6]
      end
      local payloadAt = tonumber(ARGV[b + 10]) or 0
      if kind == 'ack' and payloadAt > 0 then
        payloads[#payloads + 1] = KEYS[payloadAt]
      end
      local activeAt, requestToken = tonumber(ARGV[b + 7]), ARGV[b + 8]
      if activeAt > 0 and requestToken ~= '' then
        forget[#forget + 1] = { activeAt, requestToken }
      end
    elseif kind == 'park' then
      now = now or nowMs()
      parked[#parked + 1] = (now + tonumber(ARGV[b + 5])) / 1000
      parked[#parked + 1] = ARGV[b + 4]
    else
      local member = releaseMember[i]
      pending[#pending + 1] = storedScore(releaseScore[i]) or scoreOf(member) or 0
      pending[#pending + 1] = member
    end
    out[i] = 1
  end
end

if #drop > 0 then
  redis.call('HDEL', KEYS[1], unpack(drop))
  redis.call('HDEL', KEYS[2], unpack(drop))
  redis.call('ZREM', KEYS[3], unpack(drop))
  redis.call('HDEL', KEYS[4], unpack(drop))
end
if #finished > 0 then
  redis.call('HDEL', KEYS[5], unpack(finished))
  redis.call('ZREM', KEYS[9], unpack(finished))
end
for _, listAt in ipairs(pushOrder) do
  if listAt < 0 then
    keepUnheard(KEYS[-listAt], pushes[listAt])
  else
    redis.call('LPUSH', KEYS[listAt], unpack(pushes[listAt]))
    if ttls[listAt] > 0 then
      redis.call('EXPIRE', KEYS[listAt], ttls[listAt])
    end
  end
end
if #dead > 0 then
  redis.call('LPUSH', KEYS[8], unpack(dead))
end
if #staged > 0 then
  redis.call('HSET', KEYS[10], unpack(staged))
  redis.call('ZADD', KEYS[11], unpack(stagedAt))
end
if #parked > 0 then
  redis.call('ZADD', KEYS[7], unpack(parked))
end
if #pending > 0 then
  redis.call('ZADD', KEYS[6], unpack(pending))
end
if #payloads > 0 then
  redis.call('DEL', unpack(payloads))
end
if #forget > 0 then
  local active, cancel = {}, {}
  for j, f in ipairs(forget) do
    active[j] = KEYS[f[1]]
    cancel[j] = KEYS[f[1] + 1]
  end
  local activeNow = redis.call('MGET', unpack(active))
  local cancelNow = redis.call('MGET', unpack(cancel))
  local gone = {}
  for j, f in ipairs(forget) do
    if activeNow[j] == f[2] then
      gone[#gone + 1] = active[j]
    end
    if cancelNow[j] == f[2] then
      gone[#gone + 1] = cancel[j]
    end
  end
  if #gone > 0 then
    redis.call('DEL', unpack(gone))
  end
end
return out
