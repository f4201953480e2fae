--[[ promote: parked -> pending, for retries whose backoff has elapsed; also moves due entries out
  of the Go processor's shared retry sorted set during a migration.

  Each due member returns to its queue scored by its deadline (earliest deadline first). A member
  whose deadline cannot be read goes back at score 0, where the consumer dead-letters it with a
  reason: nothing is dropped here.

  Input:
    KEYS[1] parked       zset  member -> due time, Unix seconds
    KEYS[2] pending      zset  (this queue)
    KEYS[3] Go retry set zset  (optional; e.g. retry-sortedset). Its members name their origin
                               queue in internal.request_queue_name; only this queue's are moved
                               (and, when ARGV[3] is "1", those that name no queue). Not used in
                               Redis Cluster mode, where it would cross slots.
    ARGV[1] how many to move at most, per set
    ARGV[2] this queue's name (KEYS[2])
    ARGV[3] "1" when this queue is the default for Go retry members naming no queue
    ARGV[4] where this call's scan of the Go retry set starts (a rank among its due entries):
            the previous call's answer, so due entries of other queues ahead of this queue's
            are passed over call by call instead of hiding them

  Output: { number of members moved to pending, where the next scan of the Go retry set starts
  (0: this one reached its end), milliseconds until the earliest entry left in parked or the Go
  retry set is due (0: one is due already, say another queue's Go retry; -1: both are empty) },
  or a WRONGTYPE error (nothing moved) when pending holds another type than a sorted set.
  The third lets an idle promoter sleep until there is something to move.
]]
--- @include nowMs
--- @include deadlineOf
--- @include writable
local nowAt = nowMs()
local now = nowAt / 1000
local limit = tonumber(ARGV[1])
local moved = 0
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
-- Before the first write, pending must take its writes (see writable): a ZADD refused after the
-- ZREM would leave the member nowhere.
local refused = wrongTypeOf({ false, 'zset' }, 2)
if refused then
  return refused
end
-- Each member is removed before it is added: a ZREM is never refused for memory, and once a
-- script has written, Redis lets its later writes through, so promote works while Redis is out
-- of memory (the move does not grow it).
for _, member in ipairs(due) do
  redis.call('ZREM', KEYS[1], member)
  redis.call('ZADD', KEYS[2], scoreOf(member) or 0, member)
  moved = moved + 1
end
local nextScan = 0
if KEYS[3] then
  local from = tonumber(ARGV[4]) or 0
  local page = limit * 4
  local scanned = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', from, page)
  -- Where the next call goes on: past what this one looked at, less what it removed (the
  -- entries behind move up), or from the start once the end was reached.
  local passed, removed = 0, 0
  for _, member in ipairs(scanned) do
    passed = passed + 1
    local ok, env = pcall(cjson.decode, member)
    local origin = ''
    if ok and type(env) == 'table' and type(env.internal) == 'table'
        and type(env.internal.request_queue_name) == 'string' then
      origin = env.internal.request_queue_name
    end
    if origin == ARGV[2] or (origin == '' and ARGV[3] == '1') then
      redis.call('ZREM', KEYS[3], member)
      redis.call('ZADD', KEYS[2], scoreOf(member) or 0, member)
      moved = moved + 1
      removed = removed + 1
      if moved >= limit * 2 then break end
    end
  end
  if #scanned == page or passed < #scanned then
    nextScan = from + passed - removed
  end
end
-- When the earliest entry left is due: parked's own, or the Go retry set's (any queue's).
local untilDue = -1
for k = 1, 3, 2 do
  if KEYS[k] then
    local first = redis.call('ZRANGE', KEYS[k], 0, 0, 'WITHSCORES')
    local at = first[2] and tonumber(first[2])
    if at then
      local wait = math.max(0, math.ceil(at * 1000 - nowAt))
      if untilDue < 0 or wait < untilDue then
        untilDue = wait
      end
    end
  end
end
return { moved, nextScan, untilDue }
