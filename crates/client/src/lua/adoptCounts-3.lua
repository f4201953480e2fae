--[[ adoptCounts: gives a deadline entry to delivery counts that have none, a page at a time.

  reclaim drops a delivery count once its generation's deadline has passed, by the count's entry
  in deliveries-idx (see reclaim). Releases before deliveries-idx counted deliveries without an
  entry, and one still running in a mixed fleet (a rolling upgrade, a rollback) still does; a
  count without an entry whose generation then left the queue without a finish (its producer
  ZREMed it, a Go instance finished it) would stay for good, and `inferq status` would count it
  as a request delivered again for good. Each call looks at one HSCAN page of the counts and
  indexes those without an entry:
    - its generation is claimed: by the claimed member's deadline (0 when it cannot be read:
      such a member is dead-lettered once pending, as reclaim indexes it);
    - otherwise (pending, parked or gone; only the member would say, and it is not at hand):
      ARGV[3] seconds from now. A live generation keeps its count that long, and reclaim puts
      the real deadline in place the next time it counts one for it.
  Writes only entries that were missing, so a count reclaim or finish indexed keeps its own.

  Input:
    KEYS[1] deliveries     hash  claim key -> lease expiries so far
    KEYS[2] deliveries-idx zset  claim key -> the generation's deadline, Unix seconds
    KEYS[3] claimed        hash  claim key -> member
    ARGV[1] HSCAN cursor this page starts at ("0": the first page)
    ARGV[2] fields per page (HSCAN's COUNT hint)
    ARGV[3] seconds from now until the count of a generation that is not claimed goes

  Output: { cursor of the next page ("0": this page ended the scan), counts indexed }, or a
  WRONGTYPE error (nothing written) when deliveries-idx holds another type than a sorted set.
]]
--- @include nowMs
--- @include deadlineOf
--- @include writable
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local fields = {}
for i = 1, #page[2], 2 do
  fields[#fields + 1] = page[2][i]
end
if #fields == 0 then
  return { page[1], 0 }
end
local indexed = redis.call('ZMSCORE', KEYS[2], unpack(fields))
local missing = {}
for i, ck in ipairs(fields) do
  if not indexed[i] then
    missing[#missing + 1] = ck
  end
end
if #missing == 0 then
  return { page[1], 0 }
end
if not writable(KEYS[2], 'zset') then
  return wrongType(KEYS[2], 'zset')
end
local members = redis.call('HMGET', KEYS[3], unpack(missing))
local later = nowMs() / 1000 + tonumber(ARGV[3])
local entries = {}
for i, ck in ipairs(missing) do
  local at = later
  if members[i] then
    at = deadlineOf(members[i]) or 0
  end
  entries[#entries + 1] = at
  entries[#entries + 1] = ck
end
redis.call('ZADD', KEYS[2], unpack(entries))
return { page[1], #missing }
