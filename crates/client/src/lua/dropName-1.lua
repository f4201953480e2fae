--[[ dropName (reliable consumers): gives a consumer name's lease up when its consumer stops, so
  a successor under the same name starts at once instead of waiting for the lease to lapse.

  Input:
    KEYS[1] the name's lease (<result list>:taken:<consumer>:lease)
    ARGV[1] this process's token
  Output: 1 dropped; 0 not held by this token (nothing changed)
]]
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
