-- begin: the input file was validated. `ok` moves the batch validating -> in_progress with its
-- line count; `failed` moves it validating -> failed with the errors, takes it off the live
-- set and ends it (`ended`: its held lines leave the tenant's count, its record's removal is
-- due). A batch cancelled while it was validated is left as it is.
-- KEYS[1] the batch hash  KEYS[2] the counts hash  KEYS[3] the live zset
-- KEYS[4] the enqueued hash  KEYS[5] the expiries zset  KEYS[6] the input file's hash
-- ARGV[1] "ok" | "failed"  ARGV[2] total lines (ok) or the errors object as JSON (failed)
-- ARGV[3] batch id  ARGV[4] how long an ended batch's record is kept, seconds
-- Returns the batch's status after the call.
--- @include move
--- @include ended
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'validating' then
  return status or ''
end
local now = now_secs()
if ARGV[1] == 'ok' then
  redis.call('HSET', KEYS[1], 'total', ARGV[2], 'ingested', 0, 'cursor', 0)
  move(KEYS[1], KEYS[2], 'in_progress', now)
  return 'in_progress'
end
redis.call('HSET', KEYS[1], 'errors', ARGV[2])
move(KEYS[1], KEYS[2], 'failed', now)
redis.call('ZREM', KEYS[3], ARGV[3])
ended(KEYS[1], KEYS[4], KEYS[5], KEYS[6], ARGV[3], ARGV[4], now)
return 'failed'
