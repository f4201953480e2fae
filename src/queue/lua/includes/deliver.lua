-- deliver(key, values, publish): hands results to their consumers. Without `publish`, LPUSHes
-- them onto the list `key` (consumers BRPOP it, so LPUSH keeps FIFO order). With it, PUBLISHes
-- each on the channel `key`, as Go's redis-pubsub transport does for its SUBSCRIBEd consumers;
-- one that no subscriber received is LPUSHed onto the list of the same name instead of being
-- lost, for `inferq results` to fetch later; that list keeps the newest UNHEARD_KEPT of them
-- (older ones are dropped, as Go drops every unheard result), so a deployment that never reads
-- it does not grow Redis without bound. The caller has checked that `key` may be written as a
-- list.
local UNHEARD_KEPT = 100000
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
    -- Best effort: under an ACL rule written before this trim (no +ltrim) the list is left
    -- untrimmed rather than failing the moves that follow in the calling script.
    redis.pcall('LTRIM', key, 0, UNHEARD_KEPT - 1)
  end
end
