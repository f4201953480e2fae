--[[ The router's cancel (producer v0.9.0's CancelRequests): the active generation's token is
  copied into the cancel marker, so an AP drops that generation before dispatch; a request with
  no active generation is left alone.
  KEYS[1] request-active:<tenant>:<id>
  KEYS[2] request-cancel:<tenant>:<id>
  ARGV[1] the cancel marker's TTL, seconds (7 days)
  returns 1 when the marker was set, 0 when nothing was active
]]
local active = redis.call("GET", KEYS[1])
if not active then
  return 0
end
redis.call("SET", KEYS[2], active, "EX", ARGV[1])
return 1
