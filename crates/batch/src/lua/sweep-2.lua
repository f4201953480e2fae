-- sweep: removes up to ARGV[2] files and ended batches whose time has come (the expiries zset:
-- id -> Unix seconds), each in this one move, so of all the replicas sweeping exactly one
-- removes each. A file goes with its hash and its place in its tenant's list; the caller then
-- deletes its stored object (one whose caller dies first is left to the orphan sweep). A file
-- a batch not yet ended still reads (`readers` > 0), or a batch not yet ended, is looked at
-- again ARGV[4] seconds later. A batch goes with its hash, its place in its tenant's list, its
-- filed results and lease, and its status's count.
-- KEYS[1] the expiries zset  KEYS[2] the per-status counts hash
-- ARGV[1] now, Unix seconds  ARGV[2] most entries to remove  ARGV[3] the key prefix
-- ARGV[4] how long a kept entry waits before it is looked at again, seconds
-- Returns {file ids whose objects the caller deletes, batches removed, entries put off}.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local prefix = ARGV[3]
local later = tonumber(ARGV[1]) + tonumber(ARGV[4])
local files, batches, kept = {}, 0, 0
local ended = {completed = true, failed = true, expired = true, cancelled = true}
for _, id in ipairs(due) do
  if string.sub(id, 1, 6) == 'batch_' then
    local bkey = prefix .. ':batch:' .. id
    local b = redis.call('HMGET', bkey, 'status', 'tenant')
    if b[1] and not ended[b[1]] then
      redis.call('ZADD', KEYS[1], later, id)
      kept = kept + 1
    else
      if b[1] then
        redis.call('HINCRBY', KEYS[2], b[1], -1)
      end
      if b[2] then
        redis.call('ZREM', prefix .. ':batches:' .. b[2], id)
      end
      redis.call('DEL', bkey, prefix .. ':out:' .. id, prefix .. ':lease:' .. id)
      redis.call('ZREM', KEYS[1], id)
      batches = batches + 1
    end
  else
    local fkey = prefix .. ':file:' .. id
    local f = redis.call('HMGET', fkey, 'tenant', 'readers')
    if (tonumber(f[2]) or 0) > 0 then
      redis.call('ZADD', KEYS[1], later, id)
      kept = kept + 1
    else
      if f[1] then
        redis.call('ZREM', prefix .. ':files:' .. f[1], id)
      end
      redis.call('DEL', fkey)
      redis.call('ZREM', KEYS[1], id)
      files[#files + 1] = id
    end
  end
end
return {files, batches, kept}
