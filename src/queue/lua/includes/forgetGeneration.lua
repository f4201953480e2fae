-- forgetGeneration(activeKey, cancelKey, token): once a generation reached done, delete the
-- producer's cancellation state for its id, but only where it still holds this generation's
-- token, so an old generation finishing never clears a newer one's (ID reuse). The Go processor
-- did the same in a separate round trip per result.
local function forgetGeneration(activeKey, cancelKey, token)
  if token == '' then
    return
  end
  if redis.call('GET', activeKey) == token then
    redis.call('DEL', activeKey)
  end
  if redis.call('GET', cancelKey) == token then
    redis.call('DEL', cancelKey)
  end
end
