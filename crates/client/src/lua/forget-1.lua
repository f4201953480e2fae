--[[ forget: compare-and-delete of one producer marker on a Redis Cluster, after the generation it
  names has finished. request-active:<id> and request-cancel:<id> live in other slots than the
  queue, so the finish script cannot clear them as it does on one server; each is cleared here
  only while it still holds the finished generation's token, so an old generation finishing never
  clears a newer one's (ID reuse). Both expire by themselves if this step is never run.

  Input:
    KEYS[1] request-active:<id> or request-cancel:<id>
    ARGV[1] the finished generation's request token

  Output: 1 deleted; 0 it holds another token or nothing.
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
