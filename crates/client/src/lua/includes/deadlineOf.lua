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

-- seqScore(deadline, seq): the score of the newest Go producer: the deadline plus the
-- submission order among requests of the same queue and deadline (internal.enqueue_seq,
-- 1-based; 0 or absent sorts first; past 2^21 - 1 they tie) as a fraction of 2^21, as the %.17g
-- text Go writes (a Lua number's own text keeps only 14 digits).
local function seqScore(deadline, seq)
  seq = tonumber(seq) or 0
  if seq ~= seq then
    seq = 0
  end
  seq = math.floor(math.min(math.max(seq, 0), 2097151))
  return string.format('%.17g', deadline + seq / 2097152)
end

-- scoreOf(member): the member's place in pending (seqScore of its deadline and enqueue_seq), or
-- nil when its deadline is unreadable, as deadlineOf. Every re-entry into pending (release,
-- reclaim, promote) uses it when the claim's own score is not kept, so a request comes back to
-- exactly the place it left. The member is decoded once.
local function scoreOf(member)
  local ok, env = pcall(cjson.decode, member)
  if not (ok and type(env) == 'table' and type(env.data) == 'table') then
    return nil
  end
  local d = tonumber(env.data.deadline)
  if not (d and d == d and d > -math.huge and d < math.huge) then
    return nil
  end
  local seq = 0
  if type(env.internal) == 'table' then
    seq = env.internal.enqueue_seq
  end
  return seqScore(d, seq)
end

-- storedScore(text): the claim-scores entry `text` when it is a finite number (take wrote it from
-- ZMSCORE), else nil, so a hand-written or garbled entry falls back to scoreOf instead of failing
-- the ZADD after the script has written.
local function storedScore(text)
  local n = tonumber(text)
  if n and n == n and n > -math.huge and n < math.huge then
    return text
  end
  return nil
end
