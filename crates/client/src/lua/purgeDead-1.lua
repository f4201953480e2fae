--[[ purgeDead: dead -> gone, every record at once (`inferq dead-letter purge --all`): the
  operator gives the dead-lettered requests up. Their terminal records were published when they
  were dead-lettered, so nothing is owed to any consumer. One script, so the count answered is
  exactly what was removed, and a user that may not run a part of it removes nothing (a refused
  MULTI let the queued DEL run alone). The list is UNLINKed: Redis frees a big one in the
  background instead of answering nobody while it frees gigabytes (DEL of 300 MB of records
  held Redis 18 ms, and that grows with the bytes). A user refused UNLINK gets DEL.

  Input:
    KEYS[1] dead list

  Output: how many records there were
]]
local n = redis.call('LLEN', KEYS[1])
if n > 0 then
  local unlinked = redis.pcall('UNLINK', KEYS[1])
  if type(unlinked) == 'table' and unlinked.err then
    redis.call('DEL', KEYS[1])
  end
end
return n
