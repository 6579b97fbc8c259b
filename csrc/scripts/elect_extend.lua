-- SPDX-License-Identifier: MIT
--! op elect_extend keys=lock,fence flags=ms
-- elect_extend: KEYS lock, fence (its holder's: the term); ARGV[1] a leader's token, ARGV[2] ttl (ms). A
-- leader's renewal: its extend, where the token is compared up to the value
-- it carries (the leader is the same while it proclaims another: see
-- lib/announce.lua), so that a renewal on its way as the value changes does
-- not find the lock another's.
local v = redis.call('GET', KEYS[1])
local id = string.match(ARGV[1], '^[^ ]*')
if v and string.match(v, '^[^ ]*') == id then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {1, tonumber(ARGV[2])}
end
if v then return {-1, redis.call('PTTL', KEYS[1])} end
return {0, 0}
