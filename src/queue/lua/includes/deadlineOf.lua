-- deadlineOf(member): the request's deadline (Unix seconds) read from the envelope's
-- data.deadline, or nil when the member does not decode or the deadline is not a finite number
-- (cjson reads `nan` and `inf`; a NaN score would make the ZADD that places the member fail).
-- Only read, never re-encoded, so the member's bytes (and its payload's big integers) are
-- untouched.
local function deadlineOf(member)
  local ok, env = pcall(cjson.decode, member)
  if ok and type(env) == 'table' and type(env.data) == 'table' then
    local d = tonumber(env.data.deadline)
    if d and d == d and d > -math.huge and d < math.huge then
      return d
    end
  end
  return nil
end
