-- writable(key, kind): whether `key` can take a write of `kind` ('list', 'zset' or 'hash'): it
-- holds that kind or does not exist. Redis does not undo a script's earlier writes when a later
-- command fails, so a move checks every key it writes before its first write: a key of the wrong
-- type then changes nothing, where it would otherwise leave a request half moved. A user whose
-- ACL does not grant TYPE (README's rules do) gets no check: true.
local function writable(key, kind)
  local t = redis.pcall('TYPE', key)
  if type(t) ~= 'table' or type(t['ok']) ~= 'string' then
    return true
  end
  return t['ok'] == kind or t['ok'] == 'none'
end

-- wrongType(key, kind): the error a move answers, before writing anything, when one of the
-- queue's own keys cannot take its write.
local function wrongType(key, kind)
  return redis.error_reply('WRONGTYPE ' .. key .. ' must be a ' .. kind .. ' (or absent) for '
    .. 'inferq to move requests through it; nothing was moved')
end

-- wrongTypeOf(kinds, last): for KEYS[1..last], where kinds[k] is the kind KEYS[k] is written as
-- (false or nil: not written), the wrongType error of the first that cannot take its write, or
-- nil when all can. A move returns the error before its first write.
local function wrongTypeOf(kinds, last)
  for k = 1, last do
    if kinds[k] and not writable(KEYS[k], kinds[k]) then
      return wrongType(KEYS[k], kinds[k])
    end
  end
  return nil
end
