-- One change of the rule database, atomically.
-- KEYS[1] version counter, KEYS[2] the kind's hash, KEYS[3] change log,
-- KEYS[4] rule set version counter.
-- ARGV: 1 field, 2 op (put|delete), 3 JSON (put), 4 if-match ("" any,
-- "*" must exist, "!" must not exist, else the item's version),
-- 5 expected rule set version ("" for overrides), 6 log size, 7 channel,
-- 8 now (Unix ms), 9 who, 10 kind.
-- Returns {status, detail}: ok/new version, precondition/current version,
-- absent, setchanged.
local cur = redis.call('HGET', KEYS[2], ARGV[1])
local curv = ''
if cur then curv = string.match(cur, '^(%d+)|') or '' end
local m = ARGV[4]
if m == '*' then
  if not cur then return {'precondition', ''} end
elseif m == '!' then
  if cur then return {'precondition', curv} end
elseif m ~= '' then
  if curv ~= m then return {'precondition', curv} end
end
if ARGV[2] == 'delete' and not cur then return {'absent', ''} end
if ARGV[5] ~= '' then
  local sv = redis.call('GET', KEYS[4]) or '0'
  if sv ~= ARGV[5] then return {'setchanged', sv} end
  redis.call('INCR', KEYS[4])
end
local v = redis.call('INCR', KEYS[1])
if ARGV[2] == 'put' then
  redis.call('HSET', KEYS[2], ARGV[1], v .. '|' .. ARGV[3])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
redis.call('LPUSH', KEYS[3], cjson.encode({version = v, at_ms = tonumber(ARGV[8]), who = ARGV[9], op = ARGV[2], kind = ARGV[10], name = ARGV[1]}))
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[6]) - 1)
redis.call('PUBLISH', ARGV[7], v)
return {'ok', tostring(v)}
