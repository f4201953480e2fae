-- Handing results to their consumers. On a list (redis-sortedset), LPUSH onto it (consumers
-- BRPOP it, so LPUSH keeps FIFO order). On a channel (redis-pubsub), PUBLISH each on the channel,
-- as Go's redis-pubsub transport does for its SUBSCRIBEd consumers; one that no subscriber
-- received is LPUSHed onto the list of the same name instead of being lost, for `inferq
-- results` to fetch later; that list keeps the newest UNHEARD_KEPT of them (older ones are
-- dropped, as Go drops every unheard result), so a deployment that never reads it does not
-- grow Redis without bound. The caller has checked that `key` may be written as a list.
local UNHEARD_KEPT = 100000

-- announce(channel, value): PUBLISHes `value`. true when a subscriber heard it, false when none
-- did, or the error text when Redis refused the PUBLISH (an ACL user without the channel): Redis
-- checks a channel's rights only when the PUBLISH runs, so the caller decides what a refusal
-- means instead of the script failing half-way.
local function announce(channel, value)
  local heard = redis.pcall('PUBLISH', channel, value)
  if type(heard) == 'table' then
    return tostring(heard['err'])
  end
  return heard > 0
end

-- keepUnheard(key, values): the results no subscriber heard, onto the list of the channel's name.
local function keepUnheard(key, values)
  if #values > 0 then
    redis.call('LPUSH', key, unpack(values))
    -- Best effort: under an ACL rule written before this trim (no +ltrim) the list is left
    -- untrimmed rather than failing the moves that follow in the calling script.
    redis.pcall('LTRIM', key, 0, UNHEARD_KEPT - 1)
  end
end

-- deliver(key, values, publish): `values` onto the list `key`, or (publish) on the channel
-- `key`, those not heard (or whose PUBLISH Redis refused) onto the list of that name.
local function deliver(key, values, publish)
  if not publish then
    redis.call('LPUSH', key, unpack(values))
    return
  end
  local unheard = {}
  for _, value in ipairs(values) do
    if announce(key, value) ~= true then
      unheard[#unheard + 1] = value
    end
  end
  keepUnheard(key, unheard)
end
