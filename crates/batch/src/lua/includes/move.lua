-- move(bkey, counts, to, now): sets the batch's status to `to` with its `<to>_at` time (Unix
-- seconds) and keeps the per-status counts hash (what /metrics and `inferq status` read) true.
local function move(bkey, counts, to, now)
  local from = redis.call('HGET', bkey, 'status')
  if from then
    redis.call('HINCRBY', counts, from, -1)
  end
  redis.call('HSET', bkey, 'status', to, to .. '_at', now)
  redis.call('HINCRBY', counts, to, 1)
end
local function now_secs()
  return tonumber(redis.call('TIME')[1])
end
