-- SPDX-License-Identifier: MIT
--! op extend keys=lock,fence flags=ms
--! op write_extend keys=writer,rwfence flags=ms
-- The lock's extend (also a read-write lock's writer's): KEYS the key, and
-- its holder's fence (lib/grant.lua; a writer keeps none: an earlier
-- version's counter, if any, is left to lapse); ARGV[1] token, ARGV[2] ttl
-- (ms). Compare-and-pexpire.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {1, tonumber(ARGV[2])}
end
if v then return {-1, redis.call('PTTL', KEYS[1])} end
return {0, 0}
