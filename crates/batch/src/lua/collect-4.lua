-- collect: takes up to ARGV[1] results off the batch result list and files each under its
-- batch, in one atomic move, so a replica that dies between two calls loses nothing and no
-- result is filed twice. A result's id is `<batch id>:<line>`. It is filed (HSETNX: the first
-- result of a line wins) while its batch is in_progress or cancelling and not sealed, and
-- counts as completed (2xx) or failed; its line leaves its tenant's count of lines not yet
-- finished, and the `usage` of its answer (chat/completions' prompt_tokens and
-- completion_tokens, or input_tokens and output_tokens, with their cached and reasoning
-- details) is added to the batch's, so the Batch object's `usage` is live. The result that completes an in_progress batch moves it
-- to finalizing and makes it due; once its window has passed (the processors answer the rest
-- DEADLINE_EXCEEDED then) it is sealed `expired` instead, as OpenAI ends a batch its window
-- ran out on. Other results (unknown or ended batches, a second result of
-- a line, unreadable entries) are dropped. Each filed result also counts in its tenant's
-- `<prefix>:tenant-done` (the per-tenant `lines done` metric).
-- KEYS[1] the result list  KEYS[2] the counts hash  KEYS[3] the live zset
-- KEYS[4] the enqueued hash (tenant -> its batch lines not yet finished)
-- ARGV[1] most results to take  ARGV[2] the key prefix ("{inferq-batch}")
-- Returns {taken, filed, dropped, finalizing}.
--- @include move
local taken = redis.call('RPOP', KEYS[1], ARGV[1])
if not taken then
  return {0, 0, 0, 0}
end
local function whole(v)
  if type(v) == 'number' and v > 0 then
    return math.floor(v)
  end
  return 0
end
local function detail(t, name)
  if type(t) == 'table' then
    return whole(t[name])
  end
  return 0
end
-- Adds the answer's usage to the batch's usage_* fields.
local function add_usage(bkey, payload)
  if type(payload) ~= 'string' or not string.find(payload, '"usage"', 1, true) then
    return
  end
  local ok, body = pcall(cjson.decode, payload)
  if not ok or type(body) ~= 'table' or type(body.usage) ~= 'table' then
    return
  end
  local u = body.usage
  local input = whole(u.prompt_tokens) + whole(u.input_tokens)
  local output = whole(u.completion_tokens) + whole(u.output_tokens)
  local total = whole(u.total_tokens)
  if total == 0 then
    total = input + output
  end
  local add = {
    usage_input = input,
    usage_output = output,
    usage_total = total,
    usage_cached = detail(u.prompt_tokens_details, 'cached_tokens')
      + detail(u.input_tokens_details, 'cached_tokens'),
    usage_reasoning = detail(u.completion_tokens_details, 'reasoning_tokens')
      + detail(u.output_tokens_details, 'reasoning_tokens'),
  }
  for field, n in pairs(add) do
    if n > 0 then
      redis.call('HINCRBY', bkey, field, n)
    end
  end
end
local prefix = ARGV[2]
local filed, dropped, finalizing = 0, 0, 0
local now = nil
for _, raw in ipairs(taken) do
  local ok, msg = pcall(cjson.decode, raw)
  local bid, line = nil, nil
  if ok and type(msg) == 'table' and type(msg.id) == 'string' then
    bid, line = string.match(msg.id, '^(batch_%w+):(%d+)$')
  end
  local kept = false
  if bid then
    local bkey = prefix .. ':batch:' .. bid
    local b = redis.call('HMGET', bkey, 'status', 'sealed', 'total', 'expires_at', 'tenant', 'held')
    if (b[1] == 'in_progress' or b[1] == 'cancelling') and (not b[2] or b[2] == '') then
      if redis.call('HSETNX', prefix .. ':out:' .. bid, line, raw) == 1 then
        kept = true
        local code = tonumber(msg.status_code) or 0
        local field = 'failed'
        if code >= 200 and code < 300 then
          field = 'completed'
        end
        redis.call('HINCRBY', bkey, field, 1)
        if b[5] and (tonumber(b[6]) or 0) > 0 then
          redis.call('HINCRBY', bkey, 'held', -1)
          redis.call('HINCRBY', KEYS[4], b[5], -1)
        end
        add_usage(bkey, msg.payload)
        redis.call('HINCRBY', prefix .. ':tenant-done', b[5] or '', 1)
        local counts = redis.call('HMGET', bkey, 'completed', 'failed')
        local done = (tonumber(counts[1]) or 0) + (tonumber(counts[2]) or 0)
        if b[1] == 'in_progress' and done >= (tonumber(b[3]) or -1) then
          now = now or now_secs()
          if now >= (tonumber(b[4]) or now + 1) then
            redis.call('HSET', bkey, 'sealed', 'expired')
          else
            move(bkey, KEYS[2], 'finalizing', now)
            finalizing = finalizing + 1
          end
          redis.call('ZADD', KEYS[3], 0, bid)
        elseif b[1] == 'cancelling' then
          redis.call('ZADD', KEYS[3], 0, bid)
        end
      end
    end
  end
  if kept then
    filed = filed + 1
  else
    dropped = dropped + 1
  end
end
return {#taken, filed, dropped, finalizing}
