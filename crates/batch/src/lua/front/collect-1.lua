-- collect: takes up to ARGV[1] results off the front door's result list and files each under
-- its request, in one atomic move, then announces it: a replica that dies between two calls
-- loses nothing, no result is filed twice, and no replica pops a result another is waiting
-- for (every replica reads the filed result and wakes on the announcement).
-- A result is filed while its request's record exists and is `queued` (the first result of a
-- request wins; a second generation's, or one for a cancelled, expired or unknown request, is
-- dropped). Filing sets the record `ended` with the result's code and time, stores the result
-- for ARGV[3] seconds, keeps the record ARGV[4] seconds, and PUBLISHes the id on ARGV[5].
-- KEYS[1] the result list
-- ARGV[1] most results to take  ARGV[2] the key prefix ("{inferq-batch}")
-- ARGV[3] the result retention, seconds  ARGV[4] the record's TTL once ended, seconds
-- ARGV[5] the channel announcing filed results  ARGV[6] now, Unix seconds
-- Returns {taken, filed, dropped}.
local taken = redis.call('RPOP', KEYS[1], ARGV[1])
if not taken then
  return {0, 0, 0}
end
local prefix = ARGV[2]
local filed, dropped = 0, 0
for _, raw in ipairs(taken) do
  local ok, msg = pcall(cjson.decode, raw)
  local kept = false
  if ok and type(msg) == 'table' and type(msg.id) == 'string' and string.match(msg.id, '^req_%w+$') then
    local rkey = prefix .. ':req:' .. msg.id
    if redis.call('HGET', rkey, 'status') == 'queued' then
      local code = 'INFERENCE_ERROR'
      if type(msg.status_code) == 'number' and msg.status_code > 0 then
        code = tostring(msg.status_code)
      elseif type(msg.error_code) == 'string' and msg.error_code ~= '' then
        code = msg.error_code
      end
      redis.call('HSET', rkey, 'status', 'ended', 'code', code, 'ended_at', ARGV[6])
      redis.call('EXPIRE', rkey, ARGV[4])
      redis.call('SET', prefix .. ':res:' .. msg.id, raw, 'EX', ARGV[3])
      redis.call('PUBLISH', ARGV[5], msg.id)
      kept = true
    end
  end
  if kept then
    filed = filed + 1
  else
    dropped = dropped + 1
  end
end
return {#taken, filed, dropped}
