-- palisade: admit a fencing token and do the protected write, atomically, in Redis.
--
-- KEYS[1]  the key's mark:   palisade:{<key>}:token
-- KEYS[2]  the protected key (optional); must share the hash tag {<key>} on Redis Cluster,
--          and may not be a mark (palisade:{...}:token): see data keys, palisade:{<key>}:data:<name>
-- ARGV[1]  the fencing token: unsigned decimal, at most 20 digits (u64)
-- ARGV[2]  the key itself, for the error messages
-- ARGV[3]  the write (optional): "set" (SET KEYS[2] ARGV[4]) or "rpush" (RPUSH KEYS[2] ARGV[4])
-- ARGV[4]  the value written
--
-- The mark must exist: it is created once, empty, with SET <mark> "" NX (palisade fence
-- --create, RedisFence::create), and then holds the highest admitted token as a decimal
-- string. A missing mark gets the error reply NOMARK and nothing is written: it was
-- never created, or Redis lost it (FLUSHDB, eviction, a restart without AOF, a failover
-- to an empty replica), and starting over would admit any stale token.
--
-- Returns the previous mark as a string, or nil for the key's first token (empty mark).
-- A stale token gets the error reply
--   STALE write rejected: stale fencing token 33 for key "billing" is lower than the highest admitted token 34
-- and nothing is written. Tokens are compared as decimal strings (length, then
-- digits), not as Lua numbers, which are doubles and lose precision past 2^53.
local token = ARGV[1]
if type(token) ~= 'string' or not string.match(token, '^[0-9]+$') then
  return redis.error_reply('ERR palisade fence: fencing token ' .. cjson.encode(tostring(token)) ..
    ' is not an unsigned decimal integer')
end
token = string.gsub(token, '^0+(%d)', '%1')
if #token > 20 or (#token == 20 and token > '18446744073709551615') then
  return redis.error_reply('ERR palisade fence: fencing token ' .. token .. ' is larger than 18446744073709551615')
end
local op = ARGV[3] or ''
if op ~= '' and op ~= 'set' and op ~= 'rpush' then
  return redis.error_reply('ERR palisade fence: unknown write ' .. cjson.encode(op) .. ' (set or rpush)')
end
if op ~= '' and (KEYS[2] == nil or ARGV[4] == nil) then
  return redis.error_reply('ERR palisade fence: a write needs KEYS[2] and ARGV[4]')
end
-- A payload written over a mark (this key's or another's) would replace it.
if op ~= '' and (KEYS[2] == KEYS[1] or
    (string.sub(KEYS[2], 1, 10) == 'palisade:{' and string.sub(KEYS[2], -7) == '}:token')) then
  return redis.error_reply('ERR palisade fence: the protected key ' .. cjson.encode(KEYS[2]) ..
    ' is a fence mark (palisade:{...}:token); write to a data key, palisade:{<key>}:data:<name>')
end

local function lower(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local key = cjson.encode(ARGV[2] or KEYS[1])
local current = redis.call('GET', KEYS[1])
if not current then
  return redis.error_reply('NOMARK fencing refused: the mark ' .. KEYS[1] .. ' of key ' .. key ..
    ' is missing: it was never created, or Redis lost it (FLUSHDB, eviction, a restart without' ..
    ' AOF, a failover to an empty replica); the fence does not start over')
end
if current ~= '' and not string.match(current, '^[0-9]+$') then
  return redis.error_reply('ERR palisade fence: the mark ' .. KEYS[1] .. ' of key ' .. key ..
    ' is not a token: ' .. cjson.encode(current))
end
if current ~= '' and lower(token, current) then
  return redis.error_reply('STALE write rejected: stale fencing token ' .. token .. ' for key ' ..
    key .. ' is lower than the highest admitted token ' .. current)
end
if current == '' or lower(current, token) then
  redis.call('SET', KEYS[1], token)
end
if op == 'set' then
  redis.call('SET', KEYS[2], ARGV[4])
elseif op == 'rpush' then
  redis.call('RPUSH', KEYS[2], ARGV[4])
end
if current == '' then
  return nil
end
return current
