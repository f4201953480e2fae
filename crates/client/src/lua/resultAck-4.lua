--[[ resultAck (durable result consumers, Go's AckResult): a claimed result is stored by its
  consumer -> done, leaving a tombstone so a repeated ack succeeds and a duplicate copy of the
  result still in the list is dropped by receive instead of delivered again.

  Fenced: only the claim's owner acks it, and only while its lease lives (by Redis TIME). Up to
  ARGV[4] expired tombstones are dropped first. The tombstone set expires as a whole ARGV[3]
  after the last ack, so an idle route cleans itself up.

  Input:
    KEYS[1] <route>:result-claimed         hash claim ID -> the result as stored
    KEYS[2] <route>:result-claim-owners    hash claim ID -> owner token
    KEYS[3] <route>:result-claims-idx      zset claim ID -> lease expiry, Unix ms
    KEYS[4] <route>:result-ack-tombstones  zset claim ID -> tombstone expiry, Unix ms
    ARGV[1] claim ID
    ARGV[2] owner token
    ARGV[3] tombstone lifetime, ms
    ARGV[4] most expired tombstones dropped per call
  Output: 1 acked now; 2 acked before (a live tombstone); 0 ownership lost (another owner, no
    claim, or its lease ran out)
]]
--- @include nowMs
local now = nowMs()
local stale = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
if #stale > 0 then
  redis.call('ZREM', KEYS[4], unpack(stale))
end
local owner = redis.call('HGET', KEYS[2], ARGV[1])
local expiry = redis.call('ZSCORE', KEYS[3], ARGV[1])
if ARGV[2] ~= '' and owner == ARGV[2] and expiry and tonumber(expiry) > now then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
  return 1
end
local tomb = redis.call('ZSCORE', KEYS[4], ARGV[1])
if tomb and tonumber(tomb) > now then
  return 2
end
if tomb then
  redis.call('ZREM', KEYS[4], ARGV[1])
end
return 0
