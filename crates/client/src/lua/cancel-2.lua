--[[ cancel (producer): mark the newest generation of an id as cancelled by copying its active
  token into the cancel marker. Unknown ids are a no-op. Same behaviour as the Go producer.

  Input:
    KEYS[1] request-active:<id>
    KEYS[2] request-cancel:<id>
    ARGV[1] marker TTL in seconds (Go: 604800, seven days)

  Output: 1 marked; 0 no active generation
]]
local token = redis.call('GET', KEYS[1])
if not token then
  return 0
end
redis.call('SET', KEYS[2], token, 'EX', tonumber(ARGV[1]))
return 1
