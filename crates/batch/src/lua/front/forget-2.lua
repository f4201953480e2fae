-- forget: undoes a create whose submission failed, so a refused call leaves nothing behind:
-- deletes the request's record while it is still `queued` and never submitted, and the
-- idempotency key when it still names the request.
-- KEYS[1] the request's hash  KEYS[2] (optional) the tenant's idempotency key
-- ARGV[1] the request's id
-- Returns 1 when the record was deleted, 0 when it was not (submitted meanwhile, or ended).
local r = redis.call('HMGET', KEYS[1], 'status', 'submitted')
if r[1] ~= 'queued' or r[2] then
  return 0
end
redis.call('DEL', KEYS[1])
if KEYS[2] then
  local held = redis.call('GET', KEYS[2])
  if held and string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then
    redis.call('DEL', KEYS[2])
  end
end
return 1
