-- create: records a request of the front door, or finds the one its idempotency key names,
-- in one atomic move, so two calls with one key (on any replicas) make one request.
-- With an idempotency key (KEYS[2]) that names a request whose record still exists:
--   the same body digest answers that request (`existing`), or `resubmit` when it was never
--   marked submitted and its last submission began more than ARGV[6] ms ago (the replica that
--   took it died in between; the caller submits it again and the clock restarts, so one caller
--   resubmits); another digest answers `conflict`. Nothing is written but that restart.
-- Otherwise a new record is written with status `queued` and a TTL, and the key (when given)
-- is pointed at it.
-- KEYS[1] the new request's hash  KEYS[2] (optional) the tenant's idempotency key
-- ARGV[1] the new request's id  ARGV[2] the body's digest  ARGV[3] the record's TTL, seconds
-- ARGV[4] the idempotency key's TTL, seconds  ARGV[5] now, Unix ms
-- ARGV[6] how old an unsubmitted request must be to be submitted again, ms
-- ARGV[7] the key prefix ("{inferq-batch}")  ARGV[8..] field, value pairs of the record
-- Returns {outcome, id}: outcome `created`, `existing`, `resubmit` or `conflict`.
if KEYS[2] then
  local held = redis.call('GET', KEYS[2])
  if held then
    local id, digest = string.match(held, '^(%S+) (%S+)$')
    if id then
      local rkey = ARGV[7] .. ':req:' .. id
      local r = redis.call('HMGET', rkey, 'status', 'submitted', 'submit_ms')
      if r[1] then
        if digest ~= ARGV[2] then
          return {'conflict', id}
        end
        if r[1] == 'queued' and not r[2]
            and tonumber(ARGV[5]) - (tonumber(r[3]) or 0) > tonumber(ARGV[6]) then
          redis.call('HSET', rkey, 'submit_ms', ARGV[5])
          return {'resubmit', id}
        end
        return {'existing', id}
      end
    end
  end
end
for i = 8, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'status', 'queued', 'submit_ms', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[3])
if KEYS[2] then
  redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[2], 'EX', ARGV[4])
end
return {'created', ARGV[1]}
