-- cancel: a user's cancel. validating or in_progress (not sealed) -> cancelling, due at once;
-- cancelling and cancelled stay as they are.
-- KEYS[1] the batch hash  KEYS[2] the counts hash  KEYS[3] the live zset
-- ARGV[1] batch id
-- Returns {status after the call, 1 when the cancel was taken or already in hand, 0 refused}.
--- @include move
local b = redis.call('HMGET', KEYS[1], 'status', 'sealed')
local status = b[1] or ''
if status == 'cancelling' or status == 'cancelled' then
  return {status, 1}
end
if (status == 'validating' or status == 'in_progress') and (not b[2] or b[2] == '') then
  move(KEYS[1], KEYS[2], 'cancelling', now_secs())
  redis.call('ZADD', KEYS[3], 0, ARGV[1])
  return {'cancelling', 1}
end
return {status, 0}
