--[[ deliverOnce: the second step of a finish across Redis Cluster slots, run in the result
  list's slot. A result staged in the queue's slot (finish-11, deadLetter-5) is pushed here at
  most once per generation, however often this step is repeated (by its finisher, by upkeep
  after the finisher died, by both at once): each push leaves a marker of the claim key beside
  the list, and a claim key already marked is not pushed again. Markers older than the
  retention are trimmed at every call; a repeat can only come from a staged result that is
  still staged, which upkeep settles long before that.

  Input:
    KEYS[1] the result list          (consumers BRPOP it; LPUSH keeps FIFO order)
    KEYS[2] its delivered markers    zset claim key -> when pushed, Unix ms ({<list>}:delivered)
    ARGV[1] how long a marker is kept, in milliseconds
    ARGV[2] the list's TTL in seconds, set by EXPIRE after a push (Go's result_ttl_seconds), or 0
    ARGV[3..] pairs: claim key, result JSON

  Output: { status per pair }: 1 pushed now; 0 pushed before (nothing written);
    or the error WRONGTYPE when the list (or the markers) hold another type: nothing written.
]]
if not writable(KEYS[1], 'list') then
  return wrongType(KEYS[1], 'list')
end
if not writable(KEYS[2], 'zset') then
  return wrongType(KEYS[2], 'zset')
end
local now = nowMs()
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]))
local out, values, marks, seen = {}, {}, {}, {}
for i = 3, #ARGV, 2 do
  local ck = ARGV[i]
  if seen[ck] or redis.call('ZSCORE', KEYS[2], ck) then
    out[#out + 1] = 0
  else
    seen[ck] = true
    values[#values + 1] = ARGV[i + 1]
    marks[#marks + 1] = now
    marks[#marks + 1] = ck
    out[#out + 1] = 1
  end
end
if #values > 0 then
  redis.call('LPUSH', KEYS[1], unpack(values))
  redis.call('ZADD', KEYS[2], unpack(marks))
  if tonumber(ARGV[2]) > 0 then
    redis.call('EXPIRE', KEYS[1], ARGV[2])
  end
end
return out
