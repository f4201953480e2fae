-- seal: freezes the batch's results for its ending (completed, cancelled or expired): from here
-- collect files no result of it, so every steward that writes its files writes the same ones.
-- The first seal wins: an expiry racing a cancel ends the batch one way only.
-- KEYS[1] the batch hash
-- ARGV[1] "completed" | "cancelled" | "expired"
-- Returns the ending the batch is sealed with, or "" when it has already ended.
local b = redis.call('HMGET', KEYS[1], 'status', 'sealed')
local status = b[1] or ''
if status == '' or status == 'completed' or status == 'failed' or status == 'expired'
    or status == 'cancelled' then
  return ''
end
if b[2] and b[2] ~= '' then
  return b[2]
end
redis.call('HSET', KEYS[1], 'sealed', ARGV[1])
return ARGV[1]
