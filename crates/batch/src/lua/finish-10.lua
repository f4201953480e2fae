-- finish: a steward wrote the sealed batch's output and error files under fresh ids. The first
-- finish records them (File objects in the tenant's list, each expiring ARGV[12] seconds after
-- it is made), the counts, and the ending; takes the batch off the live set, drops its filed
-- results (they are in the files now) and ends it (`ended`: its held lines leave the tenant's
-- count, its record's removal is due). A later finish (a steward that lost its lease and wrote
-- the same batch again) changes nothing, and its caller deletes the files it wrote.
-- KEYS[1] the batch hash  KEYS[2] the counts hash  KEYS[3] the live zset
-- KEYS[4] the batch's filed results hash  KEYS[5] the output file's hash
-- KEYS[6] the error file's hash  KEYS[7] the tenant's files zset
-- KEYS[8] the enqueued hash  KEYS[9] the expiries zset  KEYS[10] the input file's hash
-- ARGV[1] batch id  ARGV[2] output file id or ""  ARGV[3] error file id or ""
-- ARGV[4] completed  ARGV[5] failed  ARGV[6] total  ARGV[7] output bytes  ARGV[8] error bytes
-- ARGV[9] tenant  ARGV[10] now, Unix ms  ARGV[11] how long the batch's record is kept, seconds
-- ARGV[12] how long its output and error files are kept, seconds
-- Returns {status after the call, 1 when this call ended the batch else 0}.
--- @include move
--- @include ended
local b = redis.call('HMGET', KEYS[1], 'status', 'sealed')
local status = b[1] or ''
local ending = b[2] or ''
if ending == '' or status == ending then
  return {status, 0}
end
local now = now_secs()
local expires = now + (tonumber(ARGV[12]) or 0)
local function record(key, id, purpose, bytes, suffix)
  redis.call('HSET', key, 'id', id, 'bytes', bytes, 'created_at', now, 'purpose', purpose,
    'filename', ARGV[1] .. suffix,
    'tenant', ARGV[9], 'expires_at', expires)
  redis.call('ZADD', KEYS[7], ARGV[10], id)
  redis.call('ZADD', KEYS[9], expires, id)
end
redis.call('HSET', KEYS[1], 'completed', ARGV[4], 'failed', ARGV[5], 'total', ARGV[6])
if ARGV[2] ~= '' then
  record(KEYS[5], ARGV[2], 'batch_output', ARGV[7], '_output.jsonl')
  redis.call('HSET', KEYS[1], 'output_file_id', ARGV[2])
end
if ARGV[3] ~= '' then
  record(KEYS[6], ARGV[3], 'batch_output', ARGV[8], '_error.jsonl')
  redis.call('HSET', KEYS[1], 'error_file_id', ARGV[3])
end
move(KEYS[1], KEYS[2], ending, now)
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('UNLINK', KEYS[4])
ended(KEYS[1], KEYS[8], KEYS[9], KEYS[10], ARGV[1], ARGV[11], now)
return {ending, 1}
