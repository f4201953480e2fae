--[[ holdName (reliable consumers): takes or keeps the lease on a consumer name, so two live
  consumers never share one. Sharing would let each hand the other's in-progress results back to
  the result list, and the first to acknowledge would remove an entry the other still owes a
  store for. A consumer takes the lease before it hands back what its name holds, and renews it
  while it runs; one whose lease went to another process stops without acknowledging.

  Input:
    KEYS[1] the name's lease (<result list>:taken:<consumer>:lease), a string
    ARGV[1] this process's token
    ARGV[2] lease length in milliseconds
  Output: 1 held by this token (taken now, renewed, or taken again after it lapsed untaken);
          0 held by another token (nothing changed)
]]
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
