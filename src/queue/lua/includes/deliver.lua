-- deliver(key, values, publish): hands results to their consumers. Without `publish`, LPUSHes
-- them onto the list `key` (consumers BRPOP it, so LPUSH keeps FIFO order). With it, PUBLISHes
-- each on the channel `key`, as Go's redis-pubsub transport does for its SUBSCRIBEd consumers;
-- one that no subscriber received is LPUSHed onto the list of the same name instead of being
-- lost, for `inferq results` to fetch later. The caller has checked that `key` may be written
-- as a list.
local function deliver(key, values, publish)
  if not publish then
    redis.call('LPUSH', key, unpack(values))
    return
  end
  local unheard = {}
  for _, value in ipairs(values) do
    if redis.call('PUBLISH', key, value) == 0 then
      unheard[#unheard + 1] = value
    end
  end
  if #unheard > 0 then
    redis.call('LPUSH', key, unpack(unheard))
  end
end
