-- lease: takes, renews or gives up the steward lease of a batch. Only one replica works a
-- batch's moves at a time; a replica that dies stops renewing and another takes over once the
-- lease lapses.
-- KEYS[1] the lease key
-- ARGV[1] "take" | "renew" | "drop"  ARGV[2] the owner token  ARGV[3] lease length, ms
-- Returns 1 when this owner holds (take, renew) or gave up (drop) the lease, else 0.
local owner = redis.call('GET', KEYS[1])
if ARGV[1] == 'take' then
  if owner and owner ~= ARGV[2] then
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if owner ~= ARGV[2] then
  return 0
end
if ARGV[1] == 'renew' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return 1
