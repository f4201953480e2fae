-- ingest: puts a round trip's worth of a batch's lines on the request queue, each as the Go
-- producer submits one (clear its cancel marker, set its active token until the deadline, add
-- it to the pending set at its deadline), in one script call instead of one each: the batch's
-- ingestion rate is bounded by these calls. Members carry no `enqueue_seq`: every line of a
-- batch has the same deadline, and their order among themselves does not matter. Standalone
-- and Sentinel only (the markers live in other slots than the queue on a Cluster, where the
-- producer's per-request script is used).
-- KEYS[1] the request queue (sorted set)
-- ARGV[1] the deadline (the score)  ARGV[2] how long the active markers live, ms
-- ARGV[3..] per request, four: its active key, its cancel key, its request token, its member
-- Returns how many requests were queued.
local n = 0
for i = 3, #ARGV, 4 do
  redis.call('DEL', ARGV[i + 1])
  redis.call('SET', ARGV[i], ARGV[i + 2], 'PX', ARGV[2])
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[i + 3])
  n = n + 1
end
return n
