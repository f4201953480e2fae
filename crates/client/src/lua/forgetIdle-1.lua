--[[ forgetIdle (fair-share discovery): takes a queue off the index of queues with work once a
  processor found it empty, unless work was added since the processor read its entry: a
  producer writes its requests first and the entry after, with a newer score, so an entry
  whose score is still the one read names no work added since (and the producer's next write
  puts it back).

  Input:
    KEYS[1] the index (zset: queue name -> Unix ms work was last added)
    ARGV[1] the queue name
    ARGV[2] the score the processor read
  Output: 1 removed; 0 left alone (newer work, or already gone)
]]
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
