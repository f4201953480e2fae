-- join: decides, in one atomic move, whether a request with a client-chosen id is new or joins
-- the one already submitted under that id (on any replica), so a repeated id runs the work once.
-- The key holds "<body digest> <token> <unix ms>" of the generation that was submitted.
-- With no key, or when ARGV[5] names the token the key holds (the caller found that generation
-- ended, fetched or lost and takes its place), the key is set to the new generation and the
-- caller submits it. Otherwise nothing is written: the same digest joins, another conflicts.
-- KEYS[1] the join key, inferq-front:join:<tenant>:<id>
-- ARGV[1] the body's digest  ARGV[2] the new generation's token  ARGV[3] now, Unix ms
-- ARGV[4] the key's TTL, seconds  ARGV[5] the token to take the place of, or ""
-- Returns {outcome, token, unix ms}: outcome `created` (the new token), `existing` or
-- `conflict` (the held generation's token and submission time).
local held = redis.call('GET', KEYS[1])
if held then
  local digest, token, ms = string.match(held, '^(%S+) (%S+) (%S+)$')
  if token and token ~= ARGV[5] then
    if digest == ARGV[1] then
      return {'existing', token, ms}
    end
    return {'conflict', token, ms}
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3], 'EX', ARGV[4])
return {'created', ARGV[2], ARGV[3]}
