--[[ handBack (reliable consumers): a consumer's in-progress list -> the result list. Returns the
  results a consumer took but never acknowledged (it died before storing them) so the next BRPOP
  or BLMOVE sees them first, oldest first.

  Input:
    KEYS[1] the consumer's in-progress list (<result list>:taken:<consumer>)
    KEYS[2] the result list
  Output: number of results handed back
]]
local n = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do
  n = n + 1
end
return n
