--[[ enqueue: producer -> pending on a Redis Cluster, where the producer's markers and a body
  stored apart live in other slots: the caller has written them first (cancel marker cleared,
  active marker set, body set), and this step takes the FIFO number and queues the member, both
  in the queue's slot. As submit-5, without the keys of other slots.

  Input:
    KEYS[1] request-seq:{<queue>}:<deadline>  the FIFO counter
    KEYS[2] pending                           zset
    ARGV[1] the member, with the placeholder "enqueue_seq":-1 in its internal routing
    ARGV[2] the deadline, Unix seconds

  Output: the sequence number the member got; a WRONGTYPE error, before anything is written,
    when pending holds another type than a sorted set.
]]
--- @include deadlineOf
--- @include writable
--- @include stampSeq
if not writable(KEYS[2], 'zset') then
  return wrongType(KEYS[2], 'zset')
end
local seq = stampSeq(KEYS[1], ARGV[2])
local member = withSeq(ARGV[1], seq)
redis.call('ZADD', KEYS[2], seqScore(tonumber(ARGV[2]) or 0, seq), member)
return seq
