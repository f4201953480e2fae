-- stampSeq(counter, deadline): the next FIFO number of a queue and deadline (newer Go's
-- request-seq:<queue>:<deadline>): INCR, then EXPIREAT an hour past the deadline, when no
-- request of that deadline can still be waiting to be numbered.
local function stampSeq(counter, deadline)
  local seq = redis.call('INCR', counter)
  redis.call('EXPIREAT', counter, math.floor(tonumber(deadline) or 0) + 3600)
  return seq
end

-- withSeq(member, seq): the member with its placeholder "enqueue_seq":-1 replaced by seq. The
-- producer writes the routing first, so the first match is the placeholder, never a body's text.
local function withSeq(member, seq)
  local stamped = string.gsub(member, '"enqueue_seq":%-1', '"enqueue_seq":' .. seq, 1)
  return stamped
end
