-- ended(bkey, enqueued, expiries, input, batch_id, keep_secs, now): what every ending of a batch
-- does besides its move: its lines still held leave its tenant's count of lines not yet
-- finished (KEYS enqueued: tenant -> lines), it stops reading its input file (the file's
-- `readers`, which keep the sweeper off it), and its record is due for removal `keep_secs`
-- from `now` (the expiries zset: id -> Unix seconds).
local function ended(bkey, enqueued, expiries, input, batch_id, keep_secs, now)
  local b = redis.call('HMGET', bkey, 'tenant', 'held')
  local held = tonumber(b[2]) or 0
  if b[1] and held > 0 then
    redis.call('HINCRBY', enqueued, b[1], -held)
  end
  redis.call('HSET', bkey, 'held', 0)
  if (tonumber(redis.call('HGET', input, 'readers')) or 0) > 0 then
    redis.call('HINCRBY', input, 'readers', -1)
  end
  redis.call('ZADD', expiries, now + (tonumber(keep_secs) or 0), batch_id)
end
