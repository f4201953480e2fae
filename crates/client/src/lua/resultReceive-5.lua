--[[ resultReceive (durable result consumers, Go's ReceiveResult): the oldest result of a route
  -> claimed by one receiver under a lease, in Go's keys, so inferq and Go consumers can share a
  route and each result is taken once.

  Before it looks at the list it puts back what receivers left: up to ARGV[3] claims whose lease
  ran out (by Redis TIME) are RPUSHed to the tail, the earliest expiry last, so they are taken
  again before anything newer; their claim state is dropped. Up to ARGV[5] expired tombstones
  are dropped too.

  Then it looks at up to ARGV[4] entries from the tail (producers LPUSH, so the tail is the
  oldest):
  - an entry that is no result (not JSON, no non-empty string `id`, a `request_token` that is no
    string) is claimed under "\0unparsable-result\0" .. owner and returned with -1, so the
    caller can report it and ack it (the owner is fresh per receive, so the claim ID is too);
  - a result whose claim ID (id NUL request_token, or id alone without a token) has a live ack
    tombstone or is held by an owner is a duplicate: RPOPped and dropped, and the next is looked
    at;
  - otherwise it is RPOPped and claimed: HSET claimed, HSET owners, ZADD idx now + lease.

  Input:
    KEYS[1] the route: the result list
    KEYS[2] <route>:result-claimed         hash claim ID -> the result as stored
    KEYS[3] <route>:result-claim-owners    hash claim ID -> owner token
    KEYS[4] <route>:result-claims-idx      zset claim ID -> lease expiry, Unix ms
    KEYS[5] <route>:result-ack-tombstones  zset claim ID -> tombstone expiry, Unix ms
    ARGV[1] the owner token of this receive
    ARGV[2] lease, ms
    ARGV[3] most expired claims put back per call
    ARGV[4] most list entries looked at per call
    ARGV[5] most expired tombstones dropped per call
  Output:
    {}                        the list is empty
    {0}                       only duplicates were found (dropped): call again at once
    {1, result, claim ID}     a result, claimed
    {-1, entry, claim ID}     an entry that is no result, claimed under the unparsable claim ID
]]
--- @include nowMs
local now = nowMs()
local owner = ARGV[1]
local lease = tonumber(ARGV[2])

local lapsed = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for i = #lapsed, 1, -1 do
  local claim = lapsed[i]
  local held = redis.call('HGET', KEYS[2], claim)
  if held then
    redis.call('RPUSH', KEYS[1], held)
  end
  redis.call('HDEL', KEYS[2], claim)
  redis.call('HDEL', KEYS[3], claim)
  redis.call('ZREM', KEYS[4], claim)
end

local stale = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
if #stale > 0 then
  redis.call('ZREM', KEYS[5], unpack(stale))
end

local function take(entry, claim)
  redis.call('RPOP', KEYS[1])
  redis.call('HSET', KEYS[2], claim, entry)
  redis.call('HSET', KEYS[3], claim, owner)
  redis.call('ZADD', KEYS[4], now + lease, claim)
end

-- The claim ID of a result, or nil for an entry that is no result.
local function claimOf(entry)
  local ok, r = pcall(cjson.decode, entry)
  if not ok or type(r) ~= 'table' or type(r['id']) ~= 'string' or r['id'] == '' then
    return nil
  end
  local token = r['request_token']
  if token == nil or token == '' then
    return r['id']
  end
  if type(token) ~= 'string' then
    return nil
  end
  return r['id'] .. string.char(0) .. token
end

local looks = math.min(redis.call('LLEN', KEYS[1]), tonumber(ARGV[4]))
if looks == 0 then
  return {}
end
for _ = 1, looks do
  local entry = redis.call('LINDEX', KEYS[1], -1)
  if not entry then
    return {}
  end
  local claim = claimOf(entry)
  if not claim then
    claim = string.char(0) .. 'unparsable-result' .. string.char(0) .. owner
    take(entry, claim)
    return { -1, entry, claim }
  end
  local tomb = redis.call('ZSCORE', KEYS[5], claim)
  if tomb and tonumber(tomb) <= now then
    redis.call('ZREM', KEYS[5], claim)
    tomb = false
  end
  if tomb or redis.call('HEXISTS', KEYS[3], claim) == 1 then
    redis.call('RPOP', KEYS[1])
  else
    take(entry, claim)
    return { 1, entry, claim }
  end
end
return { 0 }
