--[[ submit: producer -> pending, one request generation, as the newest Go producer enqueues it
  on one Redis: its place among requests of the same queue and deadline is taken from a counter
  in the same step it is queued, so equal deadlines are served first in, first out, and a body
  stored apart is written with it, so a member never names a body that is not there.

  Input:
    KEYS[1] request-seq:<queue>:<deadline>  the FIFO counter (expires an hour past the deadline)
    KEYS[2] request-cancel:<id>             the producer's cancel marker (cleared)
    KEYS[3] request-active:<id>             the producer's active generation (set to the token)
    KEYS[4] pending                         zset
    KEYS[5] request-payload:<id>:<token>    (optional) the body stored apart
    ARGV[1] the member, with the placeholder "enqueue_seq":-1 in its internal routing
    ARGV[2] the deadline, Unix seconds
    ARGV[3] the request token
    ARGV[4] milliseconds the active marker lives (until the deadline)
    ARGV[5] the body (with KEYS[5])
    ARGV[6] milliseconds the body lives (with KEYS[5]: the active marker's, plus ten minutes)

  The order of writes is Go's: the counter, the cancel marker, the active marker, the member,
  the body. The member's score is the deadline plus the sequence number as a fraction of 2^21
  (see scoreOf).

  Output: the sequence number the member got; a WRONGTYPE error, before anything is written,
    when pending holds another type than a sorted set.
]]
--- @include deadlineOf
--- @include writable
--- @include stampSeq
if not writable(KEYS[4], 'zset') then
  return wrongType(KEYS[4], 'zset')
end
local seq = stampSeq(KEYS[1], ARGV[2])
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
local member = withSeq(ARGV[1], seq)
redis.call('ZADD', KEYS[4], seqScore(tonumber(ARGV[2]) or 0, seq), member)
if KEYS[5] then
  redis.call('SET', KEYS[5], ARGV[5], 'PX', ARGV[6])
end
return seq
