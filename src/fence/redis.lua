-- palisade: admit a fencing token and do the protected write, atomically, in Redis.
--
-- KEYS[1]  the key's mark:   palisade:{<key>}:token (a decimal string)
-- KEYS[2]  the protected key (optional); must share the hash tag {<key>} on Redis Cluster
-- ARGV[1]  the fencing token: unsigned decimal, at most 20 digits (u64)
-- ARGV[2]  the key itself, for the error message
-- ARGV[3]  the write (optional): "set" (SET KEYS[2] ARGV[4]) or "rpush" (RPUSH KEYS[2] ARGV[4])
-- ARGV[4]  the value written
--
-- Returns the previous mark as a string, or nil for the key's first token.
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

local function lower(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local current = redis.call('GET', KEYS[1])
if current and lower(token, current) then
  return redis.error_reply('STALE write rejected: stale fencing token ' .. token .. ' for key ' ..
    cjson.encode(ARGV[2] or KEYS[1]) .. ' is lower than the highest admitted token ' .. current)
end
if not current or lower(current, token) then
  redis.call('SET', KEYS[1], token)
end
if op == 'set' then
  redis.call('SET', KEYS[2], ARGV[4])
elseif op == 'rpush' then
  redis.call('RPUSH', KEYS[2], ARGV[4])
end
return current
