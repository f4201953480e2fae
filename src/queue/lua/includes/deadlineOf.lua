-- deadlineOf(member): the request's deadline (Unix seconds) read from the envelope's
-- data.deadline, or nil when the member does not decode. Only read, never re-encoded, so the
-- member's bytes (and its payload's big integers) are untouched.
local function deadlineOf(member)
  local ok, env = pcall(cjson.decode, member)
  if ok and type(env) == 'table' and type(env.data) == 'table' and tonumber(env.data.deadline) then
    return tonumber(env.data.deadline)
  end
  return nil
end
