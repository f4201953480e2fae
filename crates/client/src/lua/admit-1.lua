--[[ admit: channel -> pending, for requests that arrive by Redis pub/sub (Go's redis-pubsub
  transport) instead of a producer's ZADD. From here on such a request is as durable as any
  other: claimed under a lease, retried, reclaimed after a crash, finished once.

  Every instance subscribed to a channel receives every message on it (Go's instances each
  executed it). Each message is admitted once: the first instance to admit its bytes sets a
  marker keyed by their digest, and the others' admits of the same bytes change nothing. The
  marker lives until the request's deadline plus ARGV[1] seconds (at most ARGV[2]), well past
  the moment all subscribers received the message.

  Input:
    KEYS[1]    pending zset  (this queue)
    KEYS[1+i]  the marker of message i: <queue>:seen:<sha1 of its bytes>
    ARGV[1]    seconds a marker outlives the message's deadline
    ARGV[2]    longest a marker lives, seconds
    ARGV[2+i]  message i, byte for byte (the envelope Go's producer publishes)

  Each admitted message is scored by its deadline (earliest deadline first); one whose deadline
  cannot be read goes in at score 0, where the consumer dead-letters it with a reason.

  Output: number of messages admitted (not seen before). A pending key of the wrong type is an
    error before anything is written.
]]
--- @include nowMs
--- @include deadlineOf
--- @include writable
if not writable(KEYS[1], 'zset') then
  return wrongType(KEYS[1], 'zset')
end
local now = nowMs() / 1000
local margin, longest = tonumber(ARGV[1]), tonumber(ARGV[2])
local add = {}
for i = 3, #ARGV do
  local member = ARGV[i]
  local deadline = deadlineOf(member)
  local ttl = math.floor(math.min(math.max((deadline or now) - now, 0) + margin, longest))
  if redis.call('SET', KEYS[i - 1], '1', 'NX', 'EX', math.max(ttl, 1)) then
    add[#add + 1] = scoreOf(member) or 0
    add[#add + 1] = member
  end
end
if #add > 0 then
  redis.call('ZADD', KEYS[1], unpack(add))
end
return #add / 2
