--[[ deliverOnce: the second step of a finish across Redis Cluster slots, run in the result
  list's slot. A result staged in the queue's slot (finish-11, deadLetter-5) is pushed here at
  most once per generation, however often this step is repeated (by its finisher, by upkeep
  after the finisher died, by both at once): each push leaves a marker of the claim key beside
  the list, and a claim key already marked is not pushed again.

  A marker must outlive two things, or a repeat would push again: its result staying staged, and
  any caller that read the staged result and has yet to push it. So markers are trimmed only
  when older than the retention and older than the queue's oldest staged result (less a minute
  for the clocks of two nodes), and a caller whose read of the staged state is older than half
  the retention is refused: it reads again.

  Input:
    KEYS[1] the result list          (consumers BRPOP it; LPUSH keeps FIFO order)
    KEYS[2] the queue's markers      zset claim key -> when pushed, Unix ms
                                     ({<list>}:delivered:<queue>)
    ARGV[1] the retention, in milliseconds
    ARGV[2] the list's TTL in seconds, set by EXPIRE after a push (Go's result_ttl_seconds), or 0
    ARGV[3] when the caller read the staged state, Unix ms of the queue's node (staleStaged-2)
    ARGV[4] the queue's oldest staged result then, Unix ms, or "" when none was staged
    ARGV[5..] pairs: claim key, result JSON

  Output: { status per pair }: 1 pushed now; 0 pushed before (nothing written);
    or the string "stale" when the caller's read is too old (nothing written);
    or the error WRONGTYPE when the list (or the markers) hold another type: nothing written.
]]
--- @include nowMs
--- @include writable
if not writable(KEYS[1], 'list') then
  return wrongType(KEYS[1], 'list')
end
if not writable(KEYS[2], 'zset') then
  return wrongType(KEYS[2], 'zset')
end
local now = nowMs()
local retention = tonumber(ARGV[1])
if now - tonumber(ARGV[3]) > retention / 2 then
  return 'stale'
end
local cutoff = now - retention
if ARGV[4] ~= '' then
  cutoff = math.min(cutoff, tonumber(ARGV[4]) - 60000)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. cutoff)
local out, values, marks, seen = {}, {}, {}, {}
for i = 5, #ARGV, 2 do
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
