-- advance: records that the batch's lines up to ARGV[2] are on the request queue (the ingestion
-- cursor a steward resumes from, and the line a cancel marks up to). It records them while the
-- batch is in_progress, and also once a cancel made it cancelling: the round trip that was in
-- flight when the cancel came is then marked like every line before it. A sealed batch records
-- nothing more.
-- KEYS[1] the batch hash
-- ARGV[1] requests submitted so far  ARGV[2] the input file's line they reach (1-based)
-- Returns the batch's status ("in_progress": go on; anything else: stop ingesting), or "sealed"
-- once it is sealed (by its expiry, or by a cancel whose steward already finished marking).
local b = redis.call('HMGET', KEYS[1], 'status', 'sealed', 'cursor')
if b[1] ~= 'in_progress' and b[1] ~= 'cancelling' then
  return b[1] or ''
end
if b[2] and b[2] ~= '' then
  return 'sealed'
end
if tonumber(ARGV[2]) > (tonumber(b[3]) or 0) then
  redis.call('HSET', KEYS[1], 'ingested', ARGV[1], 'cursor', ARGV[2])
end
return b[1]
