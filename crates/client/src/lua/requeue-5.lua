--[[ requeue: dead -> pending, as a NEW generation. An operator puts a dead-lettered request back
  in its queue (`inferq dead-letter requeue`). The dead generation already has its terminal
  record (the DEAD_LETTERED / INVALID_REQUEST result, or the dead record itself), so it must not
  reach done a second time: the caller re-encodes the member with a fresh request token, which
  makes it a new generation with its own claim key and delivery count. Its record leaves the
  dead list in the same step the new member enters pending, and only then; the producer's
  active-generation key is pointed at the new token so `cancel` reaches it.

  Input:
    KEYS[1] dead list            (inferq only; newest first)
    KEYS[2] pending              zset member -> score (deadline)
    KEYS[3] request-active:<id>  the producer's active generation
    KEYS[4] request-cancel:<id>  the producer's cancel marker
            (KEYS[3] and KEYS[4] are left out on a Redis Cluster, where they live in other
            slots: the caller checks them before and writes the active marker after)
    KEYS[5] request-payload:<...>  (optional; one Redis only) the body the member's payload_ref
            names, stored apart: the request is requeued only while it is still there. It keeps
            its TTL, ten minutes past the deadline, which a requeue does not move.
    ARGV[1] the dead record JSON, exactly as stored in the list
    ARGV[2] the new member (same data bytes, fresh request_token, retry_count 0)
    ARGV[3] its score: the request's deadline plus its enqueue_seq fraction (its place among
            equal deadlines, as it was first queued)
    ARGV[4] the fresh request token
    ARGV[5] the dead generation's request token ("" for a member written without one)
    ARGV[6] milliseconds until the deadline (lifetime of the active key, as the producer sets)
    ARGV[7] how many entries were between the record and the dead list's tail when it was read:
            LREM scans from the end the record is nearer (one record deep in a long list costs
            a scan of the list from the wrong end)

  Output:
     1  requeued
     0  the record is no longer in the dead list (requeued or purged by someone else)
    -1  the id has a newer live generation (the active key names another token): requeueing
        would make two live generations of one id; nothing changed
    -2  the producer cancelled the dead generation; nothing changed
    -3  the body stored apart is gone (its key expired or was deleted); nothing changed
  or a WRONGTYPE error (nothing changed) when pending holds another type than a sorted set.
]]
--- @include writable
-- Before the first write, pending must take its write (see writable): a ZADD refused after the
-- LREM would leave the request nowhere.
if not writable(KEYS[2], 'zset') then
  return wrongType(KEYS[2], 'zset')
end
if KEYS[3] then
  local active = redis.call('GET', KEYS[3])
  if active and active ~= ARGV[5] then
    return -1
  end
  if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) == ARGV[5] then
    return -2
  end
end
-- TYPE, not EXISTS: it is in the processor's ACL rule, which the operator's extends.
if KEYS[5] and redis.call('TYPE', KEYS[5])['ok'] == 'none' then
  return -3
end
local fromHead = 1
if (tonumber(ARGV[7]) or 0) * 2 < redis.call('LLEN', KEYS[1]) then
  fromHead = -1
end
if redis.call('LREM', KEYS[1], fromHead, ARGV[1]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
if KEYS[3] then
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[6])
end
return 1
